"""Flow control on PostgreSQL: queue settings, the limited claim, and the
enqueue-side checks (internal; mixed into ``PostgresBackend``).

The claim of a queue with settings runs ``jobkeeper_claim_limited`` (created
by migration 0007): it locks the queue's ``jobkeeper_queues`` row and then
counts held jobs and recent claims in later statements, each with a fresh
snapshot, so two workers can never both claim under one cap. Enqueues into
a queue with ``max_pending`` lock the same row and count in a second
statement, for the same reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from jobkeeper.backends.flow import configure_params, settings_from_row
from jobkeeper.backends.rows import aware_utc, job_from_row
from jobkeeper.errors import DatabaseError, QueueFull
from jobkeeper.models import Job
from jobkeeper.queues import QueueSettings

#: Seconds a backend keeps claiming a queue it found limited through the
#: limited path without asking again (the limited claim itself reads the
#: current settings: a lifted limit only costs the slower path this long).
LIMITED_RECHECK = 2.0


class FlowNeeded(Exception):  # noqa: N818 - internal signal, never escapes the backend
    """A single-statement insert met a queue with ``max_pending``: run the
    insert again in a transaction that checks it.
    """


class PostgresFlow:
    """Flow-control operations of the Backend Protocol on PostgreSQL."""

    _queries: Mapping[str, str]

    def _fetch(
        self, name: str, params: dict[str, Any] | None = None, *, binary: bool = False
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _limited_queues(self) -> dict[str, float]:
        """Queue -> monotonic time until which claims take the limited path."""
        found: dict[str, float] | None = self.__dict__.get("_limited_until")
        if found is None:
            found = self.__dict__["_limited_until"] = {}
        return found

    def _claim_is_limited(self, queue: str) -> bool:
        return self._limited_queues().get(queue, 0.0) > time.monotonic()

    def _claim_limited(self, *, worker_id: str, queue: str, limit: int) -> list[Job]:
        self._limited_queues()[queue] = time.monotonic() + LIMITED_RECHECK
        params = {"queue": queue, "worker_id": worker_id, "limit": limit}
        try:
            rows = self._fetch("job_claim_limited", params)
        except DatabaseError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.DatatypeMismatch):
                raise
            # A migration added a column to the jobs table while this claim
            # ran: planned for the old row type, the statement failed ("does
            # not match function result type") and claimed nothing. Planned
            # again, it claims (a worker logged the first try as an ERROR).
            rows = self._fetch("job_claim_limited", params)
        jobs = [job_from_row(row, aware_utc, json_decoded=True) for row in rows]
        return sorted(jobs, key=lambda j: (j.priority, j.scheduled_at, j.id))

    def _pending_full(self, cursor: psycopg.Cursor[Any], queue: str) -> QueueFull | None:
        """Whether one more job would take ``queue`` past ``max_pending``
        (the queue's row stays locked to the end of the transaction).
        """
        cursor.execute(
            self._queries["job_insert_many_lock_pending"],
            {"queues": [queue], "channel": None, "woken": []},
        )
        rows = cursor.fetchall()
        if not rows:
            return None
        limit = int(rows[0][1])
        cursor.execute(self._queries["job_insert_many_count_pending"], {"queues": [queue]})
        count = sum(int(n) for _, n in cursor.fetchall())
        return QueueFull(queue, limit, count) if count + 1 > limit else None

    def queue_settings_list(self, *, names: Sequence[str] | None = None) -> list[QueueSettings]:
        rows = self._fetch("queue_settings_list", {"names": None if names is None else list(names)})
        return [settings_from_row(row) for row in rows]

    def queue_configure(self, *, name: str, changes: Mapping[str, Any]) -> QueueSettings:
        (row,) = self._fetch("queue_configure", configure_params(name, changes))
        settings = settings_from_row(row)
        if settings.empty or settings.rate_limit is None:
            self._fetch("queue_configure_delete_if_empty", {"name": name})
        # This process's claims see the change at once.
        self._limited_queues().pop(name, None)
        return settings
