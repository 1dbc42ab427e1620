"""PostgreSQL backend: psycopg 3, a connection pool for API calls, dedicated
connections for worker threads, LISTEN/NOTIFY wake-ups.

Claims use ``FOR UPDATE SKIP LOCKED`` so any number of workers on any number
of hosts share the queue without blocking each other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from jobkeeper.backends.base import RETRY_STATUSES
from jobkeeper.backends.cockpit import CockpitReads
from jobkeeper.backends.postgres.aio import PostgresAsync
from jobkeeper.backends.postgres.arrays import array_literals
from jobkeeper.backends.postgres.claimrows import claimed_job
from jobkeeper.backends.postgres.connections import rows_of
from jobkeeper.backends.postgres.flow import PostgresFlow
from jobkeeper.backends.postgres.inserts import PostgresInserts
from jobkeeper.backends.postgres.listener import PostgresListener
from jobkeeper.backends.postgres.periodics import PostgresPeriodics
from jobkeeper.backends.postgres.queries import MIGRATIONS, QUERIES
from jobkeeper.backends.postgres.schema import RETIRED_INDEX_DROPS, PostgresSchema
from jobkeeper.backends.postgres.sources import session_name
from jobkeeper.backends.postgres.stuck import STUCK_AFTER
from jobkeeper.backends.postgres.waiters import PostgresWaiting
from jobkeeper.backends.rows import (
    STAGE_LIMIT,
    claim_arrays,
    completion_arrays,
    split_failures,
)
from jobkeeper.backends.shared import QUEUE_REMOVE_COUNTED, QUEUE_REMOVE_STEPS, SharedReads
from jobkeeper.errors import DatabaseError
from jobkeeper.models import (
    HANDED_BACK,
    Claim,
    Completion,
    Failure,
    Job,
    JobStatus,
    Staging,
    WorkerInfo,
)

__all__ = ["MIGRATIONS", "QUERIES", "PostgresBackend", "claimed_job"]

logger = logging.getLogger("jobkeeper.postgres")


class PostgresBackend(
    PostgresSchema,
    PostgresInserts,
    PostgresPeriodics,
    PostgresListener,
    SharedReads,
    CockpitReads,
    PostgresFlow,
    PostgresWaiting,
    PostgresAsync,
):
    """The PostgreSQL implementation of :class:`~jobkeeper.backends.base.Backend`.

    Args:
        url: the parsed ``postgresql://`` URL.
        dedicated: use one private connection instead of a pool.
        pool_size: most pooled connections for API calls.
    """

    name = "postgresql"
    _queries = QUERIES
    # A claim is a round trip to the server and ~13 us a row on it: with 30
    # per slot, no-op jobs still ran the buffer dry while the next claim was
    # in flight (the refill starts at half of it). Only jobs much shorter
    # than a claim get this deep a buffer (see Producer.prefetch).
    prefetch_per_slot = 100

    def dedicated(
        self, role: str = "", *, stuck_after: float | None = None, stopping: Any = None
    ) -> PostgresBackend:
        return PostgresBackend(
            self.url,
            dedicated=True,
            application_name=session_name(role),
            stuck_after=STUCK_AFTER if stuck_after is None else stuck_after,
            stopping=stopping,
        )

    def db_now(self) -> datetime:
        return self._fetch_raw(QUERIES["db_now"])[0][0].astimezone(UTC)  # type: ignore[no-any-return]

    # -- jobs ---------------------------------------------------------------

    def job_claim(self, *, worker_id: str, queue: str, limit: int) -> list[Job]:
        if self._claim_is_limited(queue):
            return self._claim_limited(worker_id=worker_id, queue=queue, limit=limit)
        # Binary results: timestamps and integers decode without text parsing.
        params = {"worker_id": worker_id, "queue": queue, "limit": limit}
        with self._cursor() as cursor:
            cursor.execute(QUERIES["job_claim"], params, binary=True)
            rows = cursor.fetchall()
        if rows and rows[-1][0] is None:
            # The queue has claim settings: nothing was claimed here.
            return self._claim_limited(worker_id=worker_id, queue=queue, limit=limit)
        utc: dict[datetime, datetime] = {}
        jobs = [claimed_job(row, worker_id, utc) for row in rows]
        return sorted(jobs, key=lambda j: (j.priority, j.scheduled_at, j.id))

    def queues_with_available(self, *, queues: Sequence[str]) -> list[str]:
        rows = self._fetch("queues_with_available", {"queues": list(queues)})
        return [row["name"] for row in rows]

    def job_start_many(self, *, claims: Sequence[Claim]) -> set[int]:
        if not claims:
            return set()
        params = array_literals(claim_arrays(claims))
        return {row[0] for row in self._fetch_raw(QUERIES["job_start_many"], params)}

    def job_abandon_many(self, *, claims: Sequence[Claim]) -> set[int]:
        if not claims:
            return set()
        params = array_literals(claim_arrays(claims))
        return {row[0] for row in self._fetch_raw(QUERIES["job_abandon_many"], params)}

    def job_start_alone(self, *, claim: Claim) -> bool:
        params = {
            "id": claim.job_id,
            "worker_id": claim.worker_id,
            "attempt": claim.attempt,
            "fence": claim.fence,
        }
        return bool(self._fetch("job_start_alone", params))

    def job_complete_many(self, *, completions: Sequence[Completion], delete: bool) -> set[int]:
        if not completions:
            return set()
        arrays = completion_arrays(completions)
        if delete:
            del arrays["results"]
        params = array_literals(arrays)
        name = "job_complete_many_delete" if delete else "job_complete_many"
        # Tuples: a dict per row cost more than reading its two columns.
        rows = self._fetch_raw(QUERIES[name], params)  # (id, awaited)
        ended = [job_id for job_id, awaited in rows if awaited]
        if ended:
            self._fetch("notify_done", {"channel": self.done_channel(), "ids": ended})
        return {job_id for job_id, _ in rows}

    def job_complete_in(self, *, connection: Any, completion: Completion, delete: bool) -> bool:
        if not isinstance(connection, psycopg.Connection):
            raise TypeError(
                "complete_in() needs a psycopg 3 Connection to this database, got "
                f"{type(connection).__module__}.{type(connection).__name__}"
            )
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
        channel = self.done_channel()  # looked up on our connection, not the caller's
        with self._errors(), connection.cursor(row_factory=tuple_row) as cursor:
            cursor.execute(
                QUERIES["job_complete_in_delete" if delete else "job_complete_in"], params
            )
            row = cursor.fetchone()
            if row is None:
                return False
            if row[1]:
                # Sent at the caller's commit, with the completion itself;
                # dropped with it on a rollback.
                cursor.execute(QUERIES["notify_done"], {"channel": channel, "ids": [row[0]]})
        return True

    def job_completed_in(self, *, claims: Sequence[Claim], delete: bool) -> set[int]:
        if not claims:
            return set()
        params = {
            "ids": [c.job_id for c in claims],
            "fences": [c.fence for c in claims],
            "delete": delete,
        }
        return {row["id"] for row in self._fetch("job_completed_in", params)}

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
        ended: list[int] = []  # awaited jobs this write ends
        channel = self.done_channel()  # looked up before the cursor is held
        with self._cursor(transaction=True) as cursor:
            if stale_after is not None:  # a rescue: see job_fail_many_lock
                cursor.execute(
                    QUERIES["job_fail_many_lock"], {"ids": [f.claim.job_id for f in failures]}
                )
            if updates:
                cursor.execute(
                    QUERIES["job_fail_many"],
                    {
                        "ids": [f.claim.job_id for f in updates],
                        "worker_ids": [f.claim.worker_id for f in updates],
                        "attempts": [f.claim.attempt for f in updates],
                        "fences": [f.claim.fence for f in updates],
                        "outcomes": [str(f.outcome) for f in updates],
                        "errors": [f.error_json for f in updates],
                        "retry_ins": [f.retry_in for f in updates],
                        "suspects": [f.suspect for f in updates],
                        "crashes": [int(f.crash) for f in updates],
                        "stale_after": stale_after,
                    },
                )
                rows = cursor.fetchall()
                written.update(row[0] for row in rows)
                ended.extend(row[0] for row in rows if row[1])
            if dead:
                cursor.execute(
                    QUERIES["job_fail_many_dead_lock"], {"ids": [f.claim.job_id for f in dead]}
                )
                cursor.execute(
                    QUERIES["job_fail_many_dead"],
                    {
                        "ids": [f.claim.job_id for f in dead],
                        "worker_ids": [f.claim.worker_id for f in dead],
                        "attempts": [f.claim.attempt for f in dead],
                        "fences": [f.claim.fence for f in dead],
                        "errors": [f.error_json for f in dead],
                        "reasons": [f.reason or "max_attempts exhausted" for f in dead],
                        "crashes": [int(f.crash) for f in dead],
                        "stale_after": stale_after,
                    },
                )
                rows = cursor.fetchall()
                written.update(row[0] for row in rows)
                ended.extend(row[0] for row in rows if row[1])
            if ended:
                # Delivered at this transaction's commit, with the ends themselves.
                cursor.execute(QUERIES["notify_done"], {"channel": channel, "ids": ended})
            released = {f.claim.job_id for f in updates if f.outcome in HANDED_BACK} & written
            if released:
                queues = {row["queue"] for row in self._released_queues(cursor, released)}
                cursor.execute(
                    QUERIES["notify_queues"], {"channel": self.channel(), "queues": sorted(queues)}
                )
        return written

    def _released_queues(self, cursor: psycopg.Cursor[Any], ids: set[int]) -> list[dict[str, Any]]:
        cursor.execute(QUERIES["job_fail_many_released_queues"], {"ids": sorted(ids)})
        return rows_of(cursor)

    def job_stage_due(self, *, queues: Sequence[str] = (), now: datetime | None = None) -> Staging:
        params = {
            "channel": self.channel(),
            "limit": STAGE_LIMIT,
            "queues": list(queues),
            "now": now,
        }
        (row,) = self._fetch("job_stage_due", params)
        staged, next_due_in = int(row["staged"]), row["next_due_in"]
        if staged >= STAGE_LIMIT:
            return Staging(staged, 0.0)  # more may be due: stage again at once
        return Staging(staged, None if next_due_in is None else float(next_due_in))

    def job_next_due_in(
        self, *, queues: Sequence[str], now: datetime | None = None
    ) -> float | None:
        result = self._fetch("job_next_due_in", {"queues": list(queues), "now": now})
        value = next(iter(result[0].values())) if result else None
        return None if value is None else float(value)

    def job_prune_finished(
        self, *, older_than: float, limit: int, now: datetime | None = None
    ) -> int:
        with self._cursor() as cursor:
            cursor.execute(
                QUERIES["job_prune_finished"],
                {"older_than": older_than, "limit": limit, "now": now},
            )
            return cursor.rowcount

    def queue_remove(self, *, queue: str) -> int:
        return self._once_more(self._queue_remove_once, queue)

    def _queue_remove_once(self, queue: str) -> int:
        removed = 0
        with self._cursor(transaction=True) as cursor:
            for name in QUEUE_REMOVE_STEPS:
                cursor.execute(QUERIES[name], {"queue": queue})
                if name in QUEUE_REMOVE_COUNTED:
                    removed += cursor.rowcount
        return removed

    def dead_letter_prune(
        self, *, older_than: float, limit: int, now: datetime | None = None
    ) -> int:
        with self._cursor() as cursor:
            cursor.execute(
                QUERIES["dead_letter_prune"],
                {"older_than": older_than, "limit": limit, "now": now},
            )
            return cursor.rowcount

    def job_table_maintain(self, *, vacuum: bool) -> list[str]:
        """Keep the planner's statistics fresh, and vacuum where autovacuum won't.

        Without statistics (a new table, a server with autovacuum off) the
        planner guesses that few jobs are available and claims with a bitmap
        scan and a sort of every available row: 36 ms per claim at 43 k
        available instead of well under 1 ms. So a table never analyzed is
        analyzed at once, without waiting for autovacuum's next round; when
        autovacuum is off, the table is analyzed after 10% of it changed and
        (with ``vacuum``) vacuumed too.
        """
        rows = self._fetch_raw(QUERIES["job_table_maintain_stats"])
        if not rows:
            return []
        changed, live, analyzed, autovacuum = rows[0]
        if not autovacuum and not self._warned_autovacuum_off:
            self._warned_autovacuum_off = True
            logger.warning(
                "autovacuum is off on this server: jobkeeper analyzes and vacuums "
                "jobkeeper_jobs itself"
            )
        # VACUUM and ANALYZE cannot run in a transaction: these connections
        # are in autocommit mode.
        if not autovacuum and vacuum:
            self._fetch_raw(QUERIES["job_table_maintain_vacuum"])
            return ["vacuum", "analyze"]
        if not analyzed or (not autovacuum and changed > max(1000, live // 10)):
            self._fetch_raw(QUERIES["job_table_maintain_analyze"])
            return ["analyze"]
        return []

    def job_cancel(self, *, job_id: int) -> Job | None:
        rows = self._cancel([job_id])
        return self._jobs(rows)[0] if rows else self.job_get(job_id=job_id)

    def job_cancel_many(self, *, job_ids: Sequence[int]) -> dict[int, JobStatus]:
        return {row["id"]: JobStatus(row["status"]) for row in self._cancel(job_ids)}

    def _cancel(self, job_ids: Sequence[int]) -> list[dict[str, Any]]:
        """``job_cancel`` of ``job_ids``, then the end of those cancelled that
        someone awaits announced; the rows changed.
        """
        rows = self._fetch("job_cancel", {"ids": list(job_ids)})
        awaited = [row["id"] for row in rows if row["status"] == "cancelled" and row["awaited"]]
        if awaited:
            self._fetch("notify_done", {"channel": self.done_channel(), "ids": awaited})
        return rows

    def job_retry(
        self, *, job_id: int, statuses: Sequence[str] = RETRY_STATUSES, fence: int | None = None
    ) -> Job | None:
        live = [status for status in statuses if status != "dead"]
        params = {"id": job_id, "statuses": live, "fence": fence}
        rows = self._fetch("job_retry", params) if live else []
        if rows:
            job = self._jobs(rows)[0]
            self._notify([job.queue])
            return job
        # A dead letter: its requeue announces it itself.
        if "dead" in statuses and self.dead_letter_requeue(job_ids=[job_id]):
            return self.job_get(job_id=job_id)
        return None

    def job_retry_many(
        self, *, job_ids: Sequence[int], statuses: Sequence[str] = RETRY_STATUSES
    ) -> list[int]:
        live = [status for status in statuses if status != "dead"]
        if not live or not job_ids:
            return []
        params = {"ids": list(job_ids), "statuses": live, "channel": self.channel()}
        return sorted(row["id"] for row in self._fetch("job_retry_many", params))

    def _notify(self, queues: Sequence[str]) -> None:
        self._fetch("notify_queues", {"channel": self.channel(), "queues": list(queues)})

    def dead_letter_requeue(self, *, job_ids: Sequence[int] | None) -> list[int]:
        params = self._requeue_params(job_ids) | {"channel": self.channel()}
        return sorted(row["id"] for row in self._fetch("dead_letter_requeue", params))

    def _requeue_params(self, job_ids: Sequence[int] | None) -> dict[str, Any]:
        return {"all": job_ids is None, "ids": list(job_ids or [])}

    def queue_stats(self) -> dict[str, dict[str, int]]:
        stats: dict[str, dict[str, int]] = {}
        for queue, status, count in self._fetch_raw(QUERIES["queue_stats"]):
            stats.setdefault(queue, {})[status] = int(count)
        return stats

    # -- workers ------------------------------------------------------------

    def worker_register(self, *, worker: WorkerInfo) -> None:
        self._fetch("worker_register", self._worker_params(worker))

    def worker_heartbeat(self, *, worker: WorkerInfo) -> None:
        with self._cursor() as cursor:
            cursor.execute(QUERIES["worker_heartbeat"], {"id": worker.id})
            if cursor.rowcount == 0:
                # Pruned while we were paused: come back. Our old claims were
                # (or will be) rescued and our fenced writes will be refused.
                cursor.execute(QUERIES["worker_register"], self._worker_params(worker))

    def worker_deregister(self, *, worker_id: str) -> None:
        self._fetch("worker_deregister", {"id": worker_id})

    def worker_prune_stale(self, *, older_than: float, now: datetime | None = None) -> int:
        with self._cursor() as cursor:
            cursor.execute(QUERIES["worker_prune_stale"], {"older_than": older_than, "now": now})
            return cursor.rowcount

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=row["id"],
                hostname=row["hostname"],
                pid=row["pid"],
                queues=list(row["queues"]),
                started_at=row["started_at"].astimezone(UTC),
                heartbeat_at=row["heartbeat_at"].astimezone(UTC),
                rescue_after=row["rescue_after"],
                version=row["version"],
            )
            for row in self._fetch("worker_list")
        ]

    # -- leadership -----------------------------------------------------------

    def leader_try_acquire(
        self, *, name: str, worker_id: str, ttl: float, now: datetime | None = None
    ) -> bool:
        params = {"name": name, "worker_id": worker_id, "ttl": ttl, "now": now}
        return bool(self._fetch("leader_try_acquire", params))

    def leader_resign(self, *, name: str, worker_id: str) -> None:
        self._fetch("leader_resign", {"name": name, "worker_id": worker_id})

    def leader_get(self, *, name: str) -> str | None:
        rows = self._fetch("leader_get", {"name": name})
        return str(rows[0]["worker_id"]) if rows else None

    # -- wake-ups -----------------------------------------------------------

    # -- dashboard, /metrics, doctor ----------------------------------------

    def _ids_param(self, job_ids: Sequence[int] | None) -> Any:
        return None if job_ids is None else list(job_ids)

    def _texts_param(self, values: Sequence[str]) -> Any:
        return list(values)

    def database_health(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "backend": self.name,
            "schema_version": self.schema_version(),
            "schema_expected": self.schema_expected(),
        }
        table = self._fetch("database_health_table")
        facts["table"] = table[0] if table else None
        if table:
            plan = self._fetch("database_health_claim_plan", {"queue": "default"})
            facts["claim_plan"] = json.dumps(plan[0]["QUERY PLAN"]) if plan else ""
            facts["claim_uses_index"] = "jobkeeper_jobs_claim_idx" in facts["claim_plan"]
            retired = [index for _, index, _ in RETIRED_INDEX_DROPS]
            facts["indexes"] = self._fetch("database_health_indexes", {"retired": retired})
        facts["xmin_holders"] = self._fetch("database_health_xmin")
        facts["notify_usage"] = float(self._fetch("database_health_notify")[0]["usage"])
        facts["encoding"] = self._fetch("database_health_encoding")[0]["encoding"]
        facts["write_error"] = self._write_probe()
        return facts

    def _write_probe(self) -> str | None:
        """None when a write that needs new space succeeds (rolled back),
        else the error: a full disk, a read-only session or standby.
        """
        try:
            self._once_more(self._rolled_back, QUERIES["database_health_write_probe"])
        except DatabaseError as exc:
            return str(exc)
        return None
