"""Backend operations whose logic is the same on every database (internal).

A backend mixes this in and supplies ``_fetch`` (run a named query, rows as
dicts) and ``_jobs`` (rows to Jobs); only the SQL differs, and it lives in
each backend's ``queries.sql`` under the method's name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jobkeeper.models import Claim, Job, JobStatus, RequeueConflict, WorkerInfo
from jobkeeper.version import worker_version

#: The statements of ``queue_remove``, in order, in one transaction (each
#: backend runs them its own way), and those whose row counts are the
#: removed jobs it returns.
QUEUE_REMOVE_STEPS = (
    "queue_remove_jobs",
    "queue_remove_dead_letters",
    "queue_remove_settings",
    "queue_remove_starts",
    "queue_remove_periodic",
)
QUEUE_REMOVE_COUNTED = frozenset({"queue_remove_jobs", "queue_remove_dead_letters"})


class SharedReads:
    """Read operations of the Backend Protocol, written once."""

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _jobs(self, rows: list[dict[str, Any]], *, dead: bool = False) -> list[Job]:
        raise NotImplementedError

    def _requeue_params(self, job_ids: Sequence[int] | None) -> dict[str, Any]:
        raise NotImplementedError

    def _now_param(self, now: datetime | None) -> Any:
        """``now`` as the ``now`` parameter of a time-dependent query (None:
        the database clock).
        """
        raise NotImplementedError

    def dead_letter_requeue_conflicts(
        self, *, job_ids: Sequence[int] | None
    ) -> list[RequeueConflict]:
        rows = self._fetch("dead_letter_requeue_conflicts", self._requeue_params(job_ids))
        return [
            RequeueConflict(row["id"], row["task"], row["unique_key"], row["holder"])
            for row in rows
        ]

    def schema_expected(self) -> int:
        raise NotImplementedError

    def _worker_params(self, worker: WorkerInfo) -> dict[str, Any]:
        """The parameters of ``worker_register``."""
        return {
            "id": worker.id,
            "hostname": worker.hostname,
            "pid": worker.pid,
            "queues": json.dumps(worker.queues),
            "rescue_after": worker.rescue_after,
            # The code registering the worker is this package: its version
            # is the worker's (a WorkerInfo built elsewhere may name one),
            # with the schema version it expects (see worker_version).
            "version": worker.version or worker_version(self.schema_expected()),
        }

    def job_rescue_candidates(
        self, *, rescue_after: float, limit: int, now: datetime | None = None
    ) -> list[Job]:
        params = {"rescue_after": rescue_after, "limit": limit, "now": self._now_param(now)}
        return self._jobs(self._fetch("job_rescue_candidates", params))

    def job_cancel_requested(self, *, worker_id: str) -> list[Claim]:
        rows = self._fetch("job_cancel_requested", {"worker_id": worker_id})
        return [Claim(row["id"], row["worker_id"], row["attempt"], row["fence"]) for row in rows]

    def job_held_by(self, *, worker_id: str) -> list[Job]:
        return self._jobs(self._fetch("job_held_by", {"worker_id": worker_id}))

    def job_confirm_holds(self, *, worker_id: str) -> list[Job]:
        return self._jobs(self._fetch("job_confirm_holds", {"worker_id": worker_id}))

    def job_get(self, *, job_id: int) -> Job | None:
        rows = self._fetch("job_get", {"id": job_id})
        if rows:
            return self._jobs(rows)[0]
        dead = self._fetch("job_get_dead_letter", {"id": job_id})
        return self._jobs(dead, dead=True)[0] if dead else None

    def _texts_param(self, values: Sequence[str]) -> Any:
        """``values`` as one parameter (an array; SQLite: a JSON array)."""
        raise NotImplementedError

    def job_list_ids(
        self,
        *,
        statuses: Sequence[str],
        queue: str | None,
        task: str | None,
        before: int | None,
        limit: int,
    ) -> list[tuple[int, JobStatus]]:
        params = {
            "statuses": self._texts_param(list(statuses)),
            "queue": queue,
            "task": task,
            "before": before,
            "limit": limit,
        }
        rows = self._fetch("job_list_ids", params)
        return [(int(row["id"]), JobStatus(row["status"])) for row in rows]

    def job_list(
        self,
        *,
        status: JobStatus | None,
        queue: str | None,
        limit: int,
        task: str | None = None,
        before: int | None = None,
        worker_id: str | None = None,
    ) -> list[Job]:
        jobs: list[Job] = []
        if status != JobStatus.DEAD:
            params = {
                "status": status.value if status else None,
                "queue": queue,
                "task": task,
                "before": before,
                "worker_id": worker_id,
                "limit": limit,
            }
            jobs += self._jobs(self._fetch("job_list", params))
        # A dead letter has no holder: a worker filter never matches one.
        if status in (None, JobStatus.DEAD) and worker_id is None:
            params = {"queue": queue, "task": task, "before": before, "limit": limit}
            rows = self._fetch("job_list_dead_letters", params)
            jobs += self._jobs(rows, dead=True)
        return sorted(jobs, key=lambda j: j.id, reverse=True)[:limit]
