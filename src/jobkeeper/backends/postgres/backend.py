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

from jobkeeper.backends.cockpit import CockpitReads
from jobkeeper.backends.migrate import apply_migrations
from jobkeeper.backends.postgres.aio import PostgresAsync
from jobkeeper.backends.postgres.connections import _retrying, _rows
from jobkeeper.backends.postgres.flow import FlowNeeded, PostgresFlow
from jobkeeper.backends.postgres.inserts import PostgresInserts
from jobkeeper.backends.postgres.listener import PostgresListener
from jobkeeper.backends.postgres.plans import insert_plan, is_single_statement, run_plan
from jobkeeper.backends.postgres.queries import MIGRATIONS, QUERIES
from jobkeeper.backends.postgres.waiters import PostgresWaiting
from jobkeeper.backends.rows import (
    STAGE_LIMIT,
    aware_utc,
    claim_arrays,
    completion_arrays,
    split_failures,
)
from jobkeeper.backends.shared import SharedReads
from jobkeeper.errors import DatabaseError, QueueFull
from jobkeeper.models import (
    HANDED_BACK,
    Claim,
    Completion,
    Failure,
    Job,
    JobStatus,
    NewJob,
    Staging,
    WorkerInfo,
)
from jobkeeper.payload import decode_args
from jobkeeper.periodic import Periodic, PeriodicRow, PeriodicTouch, periodic_from_row

__all__ = ["MIGRATIONS", "QUERIES", "PostgresBackend", "claimed_job"]

logger = logging.getLogger("jobkeeper.postgres")

#: pg_advisory_xact_lock key serialising migrate() across processes
#: (the bytes of "jobkeepr" as a big-endian int64).
MIGRATION_LOCK_KEY = 0x6A6F626B65657072


_JSON = json.JSONDecoder()


def claimed_job(row: tuple[Any, ...], worker_id: str, utc: dict[datetime, datetime]) -> Job:
    """A Job from one row of ``job_claim``'s RETURNING list (positional).

    The rest is known: the job is claimed, held by ``worker_id``, has no
    result, and no cancel was asked (a cancel flags only held jobs, and
    cancels an available one outright).
    Args are checked by :func:`decode_args` (PostgreSQL's json type accepts
    a ``\\u0000`` escape that enqueue would refuse).

    ``utc`` memoises naive UTC -> aware for one claim's rows: every row
    shares ``attempted_at`` (the claim's ``now()``), ``scheduled_at`` usually
    equals ``created_at``, and jobs enqueued together share both, so most
    ``replace`` calls (a third of this function's time) become dict hits.
    """
    (job_id, queue, task, args_text, priority, attempt, max_attempts,
     scheduled_at, created_at, attempted_at, unique_key, errors_text, fence,
     unstarted_returns, trace_context, run_alone) = row  # fmt: skip
    args, args_error = decode_args(args_text)
    try:
        errors = [] if errors_text is None else _JSON.decode(errors_text)
    except (ValueError, RecursionError):  # written by hand: the claim must not fail
        errors = []
    aware = []
    for naive in (scheduled_at, created_at, attempted_at):
        value = utc.get(naive)
        if value is None:
            value = utc[naive] = naive.replace(tzinfo=UTC)
        aware.append(value)
    return Job(
        id=job_id,
        task=task,
        args=args,
        queue=queue,
        status=JobStatus.CLAIMED,
        priority=priority,
        attempt=attempt,
        max_attempts=max_attempts,
        scheduled_at=aware[0],
        created_at=aware[1],
        attempted_at=aware[2],
        worker_id=worker_id,
        unique_key=unique_key,
        errors=errors if isinstance(errors, list) else [],
        args_error=args_error,
        fence=fence,
        unstarted_returns=unstarted_returns,
        trace_context=trace_context,
        run_alone=bool(run_alone),
    )


#: The steps of ``queue_remove``, in one transaction.
_QUEUE_REMOVE_STEPS = (
    "queue_remove_jobs",
    "queue_remove_dead_letters",
    "queue_remove_settings",
    "queue_remove_starts",
    "queue_remove_periodic",
)


class PostgresBackend(
    PostgresInserts,
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

    def dedicated(self) -> PostgresBackend:
        return PostgresBackend(self.url, dedicated=True)

    # -- schema -------------------------------------------------------------

    def migrate(self) -> int:
        with self._cursor(transaction=True) as cursor:

            def execute(statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                # No parameters: the simple protocol, which takes a whole
                # migration file of several statements at once.
                cursor.execute(statement, params or None)
                return cursor.fetchall() if cursor.description else []

            # Everything runs under one transaction-scoped lock, so concurrent
            # migrate() calls apply each migration exactly once.
            execute(QUERIES["schema_lock"], (MIGRATION_LOCK_KEY,))
            return apply_migrations(execute, MIGRATIONS, QUERIES)

    def schema_version(self) -> int:
        rows = self._fetch_raw(QUERIES["schema_exists"])
        if not rows or not rows[0][0]:
            return 0
        return int(self._fetch_raw(QUERIES["schema_version"])[0][0])

    def db_now(self) -> datetime:
        return self._fetch_raw(QUERIES["db_now"])[0][0].astimezone(UTC)  # type: ignore[no-any-return]

    # -- jobs ---------------------------------------------------------------

    def job_insert_many(self, *, jobs: Sequence[NewJob], connection: Any = None) -> list[Job]:
        if not jobs:
            return []
        delayed = any(j.delay is not None or j.run_at is not None for j in jobs)
        channel = self.channel() if delayed else None  # looked up before a cursor is held
        if connection is not None:
            return self._insert_on(connection, jobs, channel)

        # One statement (atomic on its own, no BEGIN/COMMIT round trips) when
        # it can be; a limited queue it meets makes it run again in a
        # transaction, with the flow checks (see plans.insert_plan).
        def insert(in_transaction: bool) -> list[Job]:
            with self._cursor(transaction=in_transaction) as cursor:
                plan = insert_plan(jobs, channel, in_transaction=in_transaction)
                stored: list[Job] = run_plan(cursor, plan, QUERIES)
                return stored

        if is_single_statement(jobs):
            try:
                return _retrying(lambda: insert(False))
            except FlowNeeded:
                pass
        return _retrying(lambda: insert(True))

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

    def job_start_many(self, *, claims: Sequence[Claim]) -> set[int]:
        if not claims:
            return set()
        return {row["id"] for row in self._fetch("job_start_many", claim_arrays(claims))}

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
        params = completion_arrays(completions)
        if delete:
            del params["results"]
        name = "job_complete_many_delete" if delete else "job_complete_many"
        rows = self._fetch(name, params)
        ended = [row["id"] for row in rows if row["awaited"]]
        if ended:
            self._fetch("notify_done", {"channel": self.done_channel(), "ids": ended})
        return {row["id"] for row in rows}

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
            raise DatabaseError("jobkeeper_installation is empty: run `jobkeeper migrate`")
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
        return _rows(cursor)

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
        removed = 0
        with self._cursor(transaction=True) as cursor:
            for name in _QUEUE_REMOVE_STEPS:
                cursor.execute(QUERIES[name], {"queue": queue})
                if name in ("queue_remove_jobs", "queue_remove_dead_letters"):
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
        rows = self._fetch("job_cancel", {"id": job_id})
        if rows and rows[0]["status"] == "cancelled" and rows[0]["awaited"]:
            self._fetch("notify_done", {"channel": self.done_channel(), "ids": [job_id]})
        return self._jobs(rows)[0] if rows else self.job_get(job_id=job_id)

    def job_retry(self, *, job_id: int) -> Job | None:
        rows = self._fetch("job_retry", {"id": job_id})
        if not rows and self.dead_letter_requeue(job_ids=[job_id]) == []:
            return self.job_get(job_id=job_id)
        job = self.job_get(job_id=job_id)
        if job is not None:
            self._notify([job.queue])
        return job

    def _notify(self, queues: Sequence[str]) -> None:
        self._fetch("notify_queues", {"channel": self.channel(), "queues": list(queues)})

    def dead_letter_requeue(self, *, job_ids: Sequence[int] | None) -> list[int]:
        params = {"all": job_ids is None, "ids": list(job_ids or [])}
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

    def _count_estimate(self, status: str, cap: int, share: float) -> int | None:
        if status == "dead":
            rows = self._fetch("queue_counts_estimate_dead")
        else:
            rows = self._fetch("queue_counts_estimate", {"status": status})
        try:
            return int(rows[0]["QUERY PLAN"][0]["Plan"]["Plan Rows"])
        except (IndexError, KeyError, TypeError, ValueError):
            return None

    def database_health(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "backend": self.name,
            "schema_version": self.schema_version(),
            "schema_expected": MIGRATIONS[-1][0],
        }
        table = self._fetch("database_health_table")
        facts["table"] = table[0] if table else None
        if table:
            plan = self._fetch("database_health_claim_plan", {"queue": "default"})
            facts["claim_plan"] = json.dumps(plan[0]["QUERY PLAN"]) if plan else ""
            facts["claim_uses_index"] = "jobkeeper_jobs_claim_idx" in facts["claim_plan"]
        facts["xmin_holders"] = self._fetch("database_health_xmin")
        facts["notify_usage"] = float(self._fetch("database_health_notify")[0]["usage"])
        return facts

    # -- periodic jobs ------------------------------------------------------

    def periodic_upsert(self, *, periodics: Sequence[Periodic]) -> None:
        if not periodics:
            return
        self._fetch(
            "periodic_upsert",
            {
                "names": [p.name for p in periodics],
                "schedules": [str(p.schedule) for p in periodics],
                "timezones": [p.schedule.timezone for p in periodics],
                "tasks": [p.task for p in periodics],
                "queues": [p.queue for p in periodics],
                "priorities": [p.priority for p in periodics],
                "max_attempts": [p.max_attempts for p in periodics],
                "args": [p.args_json for p in periodics],
                "catch_ups": [p.catch_up for p in periodics],
            },
        )

    def periodic_enqueue_tick(
        self,
        *,
        name: str,
        schedule: str,
        timezone: str,
        tick: datetime,
        next_tick: datetime | None,
    ) -> int | None:
        params = {
            "name": name,
            "schedule": schedule,
            "timezone": timezone,
            "tick": tick,
            "next_tick": next_tick,
        }
        # A tick into a queue at its max_pending is skipped (recorded as
        # given up, so no other worker enqueues it either) and QueueFull
        # raised for the enqueuer to log; the queue's row lock, taken by
        # the check, is held to the commit.
        full: QueueFull | None = None
        with self._cursor(transaction=True) as cursor:
            cursor.execute(QUERIES["periodic_enqueue_tick_queue"], {"name": name})
            found = cursor.fetchone()
            if found is not None:
                full = self._pending_full(cursor, found[0])
            if full is None:
                cursor.execute(QUERIES["periodic_enqueue_tick"], params)
                rows = cursor.fetchall()
                return int(rows[0][0]) if rows else None
            skip = {k: v for k, v in params.items() if k != "tick"} | {"through": tick}
            cursor.execute(QUERIES["periodic_skip"], skip)
            skipped = bool(cursor.fetchall())
        if skipped:
            raise full
        return None

    def periodic_skip(
        self,
        *,
        name: str,
        schedule: str,
        timezone: str,
        through: datetime,
        next_tick: datetime | None,
    ) -> bool:
        params = {
            "name": name,
            "schedule": schedule,
            "timezone": timezone,
            "through": through,
            "next_tick": next_tick,
        }
        return bool(self._fetch("periodic_skip", params))

    def periodic_touch(self, *, touches: Sequence[PeriodicTouch]) -> set[str]:
        if not touches:
            return set()
        params = {
            "names": [t.name for t in touches],
            "schedules": [t.schedule for t in touches],
            "timezones": [t.timezone for t in touches],
            "next_ticks": [t.next_tick_at for t in touches],
        }
        return {row["name"] for row in self._fetch("periodic_touch", params)}

    def periodic_list(self, *, stale_after: float) -> list[PeriodicRow]:
        rows = self._fetch("periodic_list", {"stale_after": stale_after})
        return [periodic_from_row(row, aware_utc) for row in rows]

    def periodic_prune(self, *, stale_after: float) -> list[str]:
        rows = self._fetch("periodic_prune", {"stale_after": stale_after})
        return sorted(row["name"] for row in rows)
