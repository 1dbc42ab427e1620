"""SQLite backend: the embedded default. WAL mode, a busy timeout, and every
write in one ``BEGIN IMMEDIATE`` transaction, except the heartbeat: a single
autocommit statement. Periodic writes read first and take the write lock only
when they have work (see the ``*_probe`` queries).

``BEGIN IMMEDIATE`` takes the database's single write lock before the claim
reads anything, so two workers (threads or processes) can never claim the
same row, with no SKIP LOCKED needed. ``synchronous=FULL`` makes every commit
durable before ``enqueue`` returns. Each thread gets its own connection.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from jobkeeper.backends.base import RETRY_STATUSES
from jobkeeper.backends.cockpit import CockpitReads, json_ids
from jobkeeper.backends.rows import STAGE_LIMIT, claim_arrays, completion_arrays, split_failures
from jobkeeper.backends.shared import QUEUE_REMOVE_COUNTED, QUEUE_REMOVE_STEPS, SharedReads
from jobkeeper.backends.sqlite import wakeups
from jobkeeper.backends.sqlite.connection import _rows
from jobkeeper.backends.sqlite.files import holders_of_removed
from jobkeeper.backends.sqlite.flow import SqliteFlow
from jobkeeper.backends.sqlite.inserts import SqliteInserts
from jobkeeper.backends.sqlite.periodics import SqlitePeriodics
from jobkeeper.backends.sqlite.queries import MIGRATIONS, QUERIES
from jobkeeper.backends.sqlite.schema import SqliteSchema
from jobkeeper.backends.sqlite.waiters import SqliteWaiting
from jobkeeper.backends.sqlite.workers import SqliteWorkers
from jobkeeper.backends.threaded import ThreadedAsync
from jobkeeper.errors import DatabaseError
from jobkeeper.models import (
    HANDED_BACK,
    Claim,
    Completion,
    Failure,
    Job,
    JobStatus,
    NewJob,
    Staging,
)

__all__ = ["MIGRATIONS", "QUERIES", "SqliteBackend"]


#: Free bytes beside the file under which ``doctor``'s write probe fails.
PROBE_MIN_FREE = 64 << 10


class _RolledBackError(Exception):
    """Ends the write probe's transaction with a rollback."""


class SqliteBackend(
    SqliteSchema,
    SqliteInserts,
    SqlitePeriodics,
    SqliteWorkers,
    SharedReads,
    CockpitReads,
    SqliteFlow,
    SqliteWaiting,
    ThreadedAsync,
):
    """The SQLite implementation of :class:`~jobkeeper.backends.base.Backend`.

    Args:
        url: the parsed ``sqlite:///`` URL.
        busy_timeout: seconds a write waits for the lock before failing with
            :class:`~jobkeeper.errors.DatabaseUnavailable`.
    """

    name = "sqlite"
    _queries = QUERIES
    # A claim runs in process but holds the one write lock for its length,
    # which the completer waits on: deeper buffers drained slower.
    prefetch_per_slot = 10

    def dedicated(
        self, role: str = "", *, stuck_after: float | None = None, stopping: Any = None
    ) -> SqliteBackend:
        # No session name (role) nor network (stuck_after, stopping). Pinned: a
        # worker stays on the file it started on (see SqliteConnection).
        return SqliteBackend(self.url, busy_timeout=self.busy_timeout, pinned=True)

    def wake_listeners(self) -> None:
        """Wake the workers that use the same database file: this process's at
        once, other processes' through the wake channel (see :mod:`.wakeups`).
        """
        wakeups.wake(self.path)

    def db_now(self) -> datetime:
        with self._errors():
            value = self._conn().execute(QUERIES["db_now"]).fetchone()[0]
        return datetime.fromtimestamp(value, UTC)

    # -- jobs ---------------------------------------------------------------

    def job_insert_many(self, *, jobs: Sequence[NewJob], connection: Any = None) -> list[Job]:
        if not jobs:
            return []
        if connection is not None:
            self._check_same_database(connection)
            with self._errors():
                return self._insert_in_caller(connection, jobs)
        with self._write() as conn:
            result = self._insert(conn, jobs)
        if any(job.status == JobStatus.AVAILABLE for job in result):
            self.wake_listeners()
        return result

    def job_claim(self, *, worker_id: str, queue: str, limit: int) -> list[Job]:
        if not self._probe("job_claim_probe", {"queue": queue}):
            return []
        # Not synced: a claim a power cut takes back leaves its job
        # available again, and the cut stopped its holder too (at-least-once
        # as always). Every outcome write is synced, so it never outlives
        # the claim it is fenced on. One fsync fewer between enqueue and start.
        with self._write(synced=False) as conn:
            # A queue with claim settings (a primary-key read) is claimed
            # under its limits, inside the same write lock.
            settings = self._claim_settings(conn, queue)
            if settings is not None:
                rows = self._claim_limited(conn, settings, worker_id=worker_id, limit=limit)
            else:
                params = {"queue": queue, "limit": limit}
                rows = self._claim_picked(conn, "job_claim_pick", params, worker_id)
        return sorted(self._jobs(rows), key=lambda j: (j.priority, j.scheduled_at, j.id))

    def queues_with_available(self, *, queues: Sequence[str]) -> list[str]:
        params = {"queues": json.dumps(list(queues))}
        with self._errors():
            rows = self._conn().execute(QUERIES["queues_with_available"], params).fetchall()
        return [row[0] for row in rows]

    def job_start_many(self, *, claims: Sequence[Claim]) -> set[int]:
        return self._per_claim("job_start_many", claims)

    def job_abandon_many(self, *, claims: Sequence[Claim]) -> set[int]:
        return self._per_claim("job_abandon_many", claims)

    def _per_claim(self, query: str, claims: Sequence[Claim]) -> set[int]:
        """Run ``query`` once per claim, fenced on it, in one write; return
        the ids of the claims it changed a row of.
        """
        if not claims:
            return set()
        arrays = claim_arrays(claims)
        written: set[int] = set()
        with self._write() as conn:
            for job_id, worker_id, attempt, fence in zip(
                arrays["ids"],
                arrays["worker_ids"],
                arrays["attempts"],
                arrays["fences"],
                strict=True,
            ):
                params = {"id": job_id, "worker_id": worker_id, "attempt": attempt, "fence": fence}
                if conn.execute(QUERIES[query], params).rowcount == 1:
                    written.add(job_id)
        return written

    def job_start_alone(self, *, claim: Claim) -> bool:
        params = {
            "id": claim.job_id,
            "worker_id": claim.worker_id,
            "attempt": claim.attempt,
            "fence": claim.fence,
        }
        with self._write() as conn:
            return conn.execute(QUERIES["job_start_alone"], params).fetchone() is not None

    def job_complete_many(self, *, completions: Sequence[Completion], delete: bool) -> set[int]:
        if not completions:
            return set()
        arrays = completion_arrays(completions)
        query = QUERIES["job_complete_many_delete" if delete else "job_complete_many"]
        written: set[int] = set()
        with self._write() as conn:
            for job_id, worker_id, attempt, fence, result in zip(
                arrays["ids"],
                arrays["worker_ids"],
                arrays["attempts"],
                arrays["fences"],
                arrays["results"],
                strict=True,
            ):
                params = {"id": job_id, "worker_id": worker_id, "attempt": attempt, "fence": fence}
                if not delete:
                    params["result"] = result
                if conn.execute(query, params).rowcount == 1:
                    written.add(job_id)
        return written

    def job_complete_in(self, *, connection: Any, completion: Completion, delete: bool) -> bool:
        # The same file, checked with a PRAGMA on the caller's connection:
        # nothing here may wait on the write lock, which the caller's
        # transaction may hold.
        self._check_same_database(connection)
        claim = completion.claim
        params: dict[str, Any] = {
            "id": claim.job_id,
            "worker_id": claim.worker_id,
            "attempt": claim.attempt,
            "fence": claim.fence,
        }
        if not delete:
            params["result"] = completion.result_json
        with self._errors():
            cursor = connection.execute(
                QUERIES["job_complete_in_delete" if delete else "job_complete_in"], params
            )
        # The caller's commit wakes waiters: they watch data_version.
        return bool(cursor.rowcount == 1)

    def job_completed_in(self, *, claims: Sequence[Claim], delete: bool) -> set[int]:
        done: set[int] = set()
        for claim in claims:
            params = {"id": claim.job_id, "fence": claim.fence, "delete": delete}
            done.update(row["id"] for row in self._fetch("job_completed_in", params))
        return done

    def installation_get(self) -> str:
        rows = self._fetch("installation_get")
        if not rows:
            raise DatabaseError(f"jobkeeper_installation is empty: {self.url.migrate_hint()}")
        return str(rows[0]["id"])

    def job_fail_many(
        self, *, failures: Sequence[Failure], stale_after: float | None = None
    ) -> set[int]:
        if not failures:
            return set()
        dead, updates = split_failures(failures)
        written: set[int] = set()
        with self._write() as conn:
            for failure in updates:
                params = {
                    "id": failure.claim.job_id,
                    "worker_id": failure.claim.worker_id,
                    "attempt": failure.claim.attempt,
                    "fence": failure.claim.fence,
                    "outcome": str(failure.outcome),
                    "error": failure.error_json,
                    "retry_in": failure.retry_in,
                    "stale_after": stale_after,
                    "suspect": failure.suspect,
                    "crash": int(failure.crash),
                }
                if conn.execute(QUERIES["job_fail_many"], params).rowcount == 1:
                    written.add(failure.claim.job_id)
            for failure in dead:
                params = {
                    "id": failure.claim.job_id,
                    "worker_id": failure.claim.worker_id,
                    "attempt": failure.claim.attempt,
                    "fence": failure.claim.fence,
                    "error": failure.error_json,
                    "reason": failure.reason or "max_attempts exhausted",
                    "stale_after": stale_after,
                }
                cancelled = dict(params)
                del cancelled["reason"]
                params["crash"] = int(failure.crash)
                if conn.execute(QUERIES["job_fail_many_dead_cancelled"], cancelled).rowcount == 1:
                    written.add(failure.claim.job_id)
                elif conn.execute(QUERIES["job_fail_many_dead"], params).rowcount == 1:
                    conn.execute(QUERIES["job_fail_many_dead_delete"], {"id": failure.claim.job_id})
                    written.add(failure.claim.job_id)
        if any(f.outcome in HANDED_BACK and f.claim.job_id in written for f in updates):
            self.wake_listeners()
        return written

    def job_stage_due(self, *, queues: Sequence[str] = (), now: datetime | None = None) -> Staging:
        pinned = self._now_param(now)
        params = {"queues": json.dumps(list(queues)), "now": pinned}
        (probe,) = self._fetch("job_stage_due_probe", params)
        next_due_in = None if probe["next_due_in"] is None else float(probe["next_due_in"])
        if probe["due"] is None:
            return Staging(0, next_due_in)
        # A job coming due between the probe and the write is staged by the
        # write or comes due at next_due_in: no wake-up is missed either way.
        with self._write() as conn:
            params = {"limit": STAGE_LIMIT, "now": pinned}
            staged = conn.execute(QUERIES["job_stage_due"], params).rowcount
        if staged:
            self.wake_listeners()
        if staged >= STAGE_LIMIT:
            return Staging(staged, 0.0)  # more may be due: stage again at once
        return Staging(staged, next_due_in)

    def job_next_due_in(
        self, *, queues: Sequence[str], now: datetime | None = None
    ) -> float | None:
        params = {"queues": json.dumps(list(queues)), "now": self._now_param(now)}
        with self._errors():
            value = self._conn().execute(QUERIES["job_next_due_in"], params).fetchone()[0]
        return None if value is None else float(value)

    def job_prune_finished(
        self, *, older_than: float, limit: int, now: datetime | None = None
    ) -> int:
        params = {"older_than": older_than, "now": self._now_param(now)}
        if not self._probe("job_prune_finished_probe", params):
            return 0
        with self._write() as conn:
            return conn.execute(QUERIES["job_prune_finished"], {**params, "limit": limit}).rowcount

    def queue_remove(self, *, queue: str) -> int:
        removed = 0
        with self._write() as conn:
            for name in QUEUE_REMOVE_STEPS:
                count = conn.execute(QUERIES[name], {"queue": queue}).rowcount
                if name in QUEUE_REMOVE_COUNTED:
                    removed += count
        return removed

    def dead_letter_prune(
        self, *, older_than: float, limit: int, now: datetime | None = None
    ) -> int:
        params = {"older_than": older_than, "limit": limit, "now": self._now_param(now)}
        with self._write() as conn:
            return conn.execute(QUERIES["dead_letter_prune"], params).rowcount

    def job_table_maintain(self, *, vacuum: bool) -> list[str]:
        # SQLite rewrites rows in place (no dead versions pile up in indexes),
        # and its planner needs no statistics to use the claim index.
        return []

    def job_cancel(self, *, job_id: int) -> Job | None:
        rows = self._cancel([job_id])
        return self._jobs(rows)[0] if rows else self.job_get(job_id=job_id)

    def job_cancel_many(self, *, job_ids: Sequence[int]) -> dict[int, JobStatus]:
        return {row["id"]: JobStatus(row["status"]) for row in self._cancel(job_ids)}

    def _cancel(self, job_ids: Sequence[int]) -> list[dict[str, Any]]:
        """``job_cancel`` of ``job_ids``: the rows changed."""
        with self._write() as conn:
            return _rows(conn.execute(QUERIES["job_cancel"], {"ids": json.dumps(list(job_ids))}))

    def job_retry(
        self, *, job_id: int, statuses: Sequence[str] = RETRY_STATUSES, fence: int | None = None
    ) -> Job | None:
        params = {
            "id": job_id,
            "statuses": json.dumps([status for status in statuses if status != "dead"]),
            "fence": fence,
        }
        with self._write() as conn:
            retried = bool(_rows(conn.execute(QUERIES["job_retry"], params)))
            if not retried and "dead" in statuses:
                retried = bool(self._requeue(conn, [job_id]))
        if not retried:
            return None
        self.wake_listeners()
        return self.job_get(job_id=job_id)

    def job_retry_many(
        self, *, job_ids: Sequence[int], statuses: Sequence[str] = RETRY_STATUSES
    ) -> list[int]:
        live = [status for status in statuses if status != "dead"]
        if not live or not job_ids:
            return []
        params = {"ids": json.dumps(list(job_ids)), "statuses": json.dumps(live)}
        with self._write() as conn:
            retried = sorted(
                row["id"] for row in _rows(conn.execute(QUERIES["job_retry_many"], params))
            )
        if retried:
            self.wake_listeners()
        return retried

    def _requeue_params(self, job_ids: Sequence[int] | None) -> dict[str, Any]:
        """Which dead letters a requeue takes (``None``: all of them)."""
        return {"all": job_ids is None, "ids": json.dumps(list(job_ids or []))}

    def _requeue(self, conn: sqlite3.Connection, job_ids: Sequence[int] | None) -> list[int]:
        params = self._requeue_params(job_ids)
        revived = [row["id"] for row in _rows(conn.execute(QUERIES["dead_letter_requeue"], params))]
        conn.execute(QUERIES["dead_letter_requeue_delete"], {"ids": json.dumps(revived)})
        return sorted(revived)

    def dead_letter_requeue(self, *, job_ids: Sequence[int] | None) -> list[int]:
        with self._write() as conn:
            ids = self._requeue(conn, job_ids)
        if ids:
            self.wake_listeners()
        return ids

    def queue_stats(self) -> dict[str, dict[str, int]]:
        stats: dict[str, dict[str, int]] = {}
        with self._errors():
            for queue, status, count in self._conn().execute(QUERIES["queue_stats"]):
                stats.setdefault(queue, {})[status] = int(count)
        return stats

    # -- wake-ups -----------------------------------------------------------

    def listen(
        self,
        *,
        on_queue: Callable[[str], None],
        stop: threading.Event,
        on_due: Callable[[str, float], None] | None = None,
    ) -> None:
        """See the Backend Protocol and :mod:`.wakeups` (``on_due`` is never
        called: SQLite sends no due times, a change of the file stands in).
        """

        def data_version() -> int:
            with self._errors():
                return int(self._conn().execute(QUERIES["listen_data_version"]).fetchone()[0])

        wakeups.listen(self.path, data_version, on_queue, stop)

    # -- dashboard, /metrics, doctor ----------------------------------------

    def _ids_param(self, job_ids: Sequence[int] | None) -> Any:
        return json_ids(job_ids)

    def _texts_param(self, values: Sequence[str]) -> Any:
        return json.dumps(list(values))

    def dead_letter_purge(
        self, *, job_ids: Sequence[int] | None, older_than: float | None
    ) -> list[int]:
        # A write like any other: under BEGIN IMMEDIATE, with its lock retries.
        params = {"ids": json_ids(job_ids), "all_ids": job_ids is None, "older_than": older_than}
        with self._write() as conn:
            rows = _rows(conn.execute(QUERIES["dead_letter_purge"], params))
        return sorted(int(row["id"]) for row in rows)

    def database_health(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "backend": self.name,
            "schema_version": self.schema_version(),
            "schema_expected": self.schema_expected(),
            # Processes still on a removed or replaced file (None: not known).
            "removed_file_holders": holders_of_removed(self.path),
        }
        if facts["schema_version"] == 0:
            if not os.path.exists(self.path):
                # Nothing answered: schema_version reads a missing file as 0.
                directory = os.path.dirname(self.path)
                facts["missing"] = {
                    "file": self.path,
                    "directory": None if os.path.isdir(directory) else directory,
                }
            return facts
        with self._errors():
            conn = self._conn()
            facts["journal_mode"] = str(
                conn.execute(QUERIES["database_health_journal_mode"]).fetchone()[0]
            )
            facts["busy_timeout_ms"] = int(
                conn.execute(QUERIES["database_health_busy_timeout"]).fetchone()[0]
            )
            plan = conn.execute(
                QUERIES["database_health_claim_plan"], {"queue": "default"}
            ).fetchall()
        facts["claim_plan"] = "; ".join(str(row[-1]) for row in plan)
        facts["claim_uses_index"] = "jobkeeper_jobs_claim_idx" in facts["claim_plan"]
        wal = self.path + "-wal"
        facts["wal_bytes"] = os.path.getsize(wal) if os.path.exists(wal) else 0
        facts["write_error"] = self._write_probe()
        return facts

    def _write_probe(self) -> str | None:
        """None when a write succeeds (rolled back), else why not: a file
        SQLite cannot write, or no room left beside it. A rolled-back write
        touches no disk here, so the free space of the file's file system is
        read too: under ``PROBE_MIN_FREE`` bytes, the next commit that grows
        the WAL or the file fails ("database or disk is full").
        """
        try:
            with self._write() as conn:
                conn.execute(QUERIES["database_health_write_probe"])
                raise _RolledBackError
        except _RolledBackError:
            pass
        except DatabaseError as exc:
            return str(exc)
        try:
            stat = os.statvfs(os.path.dirname(self.path) or ".")
        except OSError:
            return None
        free = stat.f_bavail * stat.f_frsize
        if free < PROBE_MIN_FREE:
            return f"no space left on the device holding {self.path} ({free} bytes free)"
        return None
