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

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from jobkeeper.backends.cockpit import CockpitReads, json_ids
from jobkeeper.backends.migrate import apply_migrations
from jobkeeper.backends.rows import (
    STAGE_LIMIT,
    claim_arrays,
    completion_arrays,
    epoch_to_datetime,
    insert_params,
    job_from_new,
    job_from_row,
    match_inserted,
    schedule_of,
    split_failures,
)
from jobkeeper.backends.shared import SharedReads
from jobkeeper.backends.sqlfile import load_migrations, load_queries
from jobkeeper.backends.sqlite import wakeups
from jobkeeper.config import DatabaseURL
from jobkeeper.errors import DatabaseError, DatabaseUnavailable, DataRejected, UniqueKeyConflict
from jobkeeper.models import Claim, Completion, Failure, Job, JobStatus, NewJob, Staging, WorkerInfo
from jobkeeper.periodic import Periodic, PeriodicRow, PeriodicTouch, periodic_from_row

#: The database clock as Unix seconds, UTC.
NOW_SQL = "((julianday('now') - 2440587.5) * 86400.0)"
ERRORS_PLUS_NEW_SQL = (
    "json_insert(CASE WHEN json_valid(errors) AND json_type(errors) = 'array' "
    "THEN errors ELSE '[]' END, '$[#]', "
    "json_set(json(:error), '$.at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"
)


def _expand(sql: str) -> str:
    return sql.replace("{now}", NOW_SQL).replace("{errors_plus_new}", ERRORS_PLUS_NEW_SQL)


QUERIES = {name: _expand(sql) for name, sql in load_queries("jobkeeper.backends.sqlite").items()}


def _statements(script: str) -> list[str]:
    """Split a migration on lines ending in ';' (our migrations keep to that)."""
    statements, current = [], []
    for line in script.splitlines():
        if line.lstrip().startswith("--"):
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            statements.append("\n".join(current).strip().rstrip(";"))
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return [s for s in statements if s]


#: sqlite3 runs one statement at a time: each migration is split into its statements.
MIGRATIONS = [
    (version, _statements(_expand(script)))
    for version, script in load_migrations("jobkeeper.backends.sqlite.migrations")
]


def _rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    if cursor.description is None:
        return []
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    message = str(exc).lower()
    return "locked" in message or "busy" in message


#: OperationalError texts of conditions that pass (trying later is the remedy).
_PASSING_CONDITIONS = ("disk is full", "readonly", "disk i/o error", "unable to open")


T = TypeVar("T")


def _retry_while_locked(action: Callable[[], T], timeout: float) -> T:
    """Run ``action`` and return its result, retrying with jittered backoff
    while SQLite reports the database locked, for up to ``timeout`` seconds.

    For what the busy timeout does not cover: switching a new file to WAL
    needs an exclusive lock, and connections opened at the same moment (four
    processes running ``migrate`` at once) get "database is locked" at once.
    """
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.25)


class SqliteBackend(SharedReads, CockpitReads):
    """The SQLite implementation of :class:`~jobkeeper.backends.base.Backend`.

    Args:
        url: the parsed ``sqlite:///`` URL.
        busy_timeout: seconds a write waits for the lock before failing with
            :class:`~jobkeeper.errors.DatabaseUnavailable`.
    """

    name = "sqlite"

    def __init__(self, url: DatabaseURL, *, busy_timeout: float = 30.0) -> None:
        self.url = url
        self.path = os.path.abspath(url.path)
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()

    # -- plumbing -----------------------------------------------------------

    def _conn(self, *, create: bool = False) -> sqlite3.Connection:
        """This thread's connection. Only ``migrate`` may create the file:
        anything else on a missing file would leave an empty database behind
        and then fail anyway.
        """
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if not create and not os.path.exists(self.path):
                raise DatabaseError(
                    f"SQLite database {self.path!r} does not exist -- run `jobkeeper migrate` "
                    "(or JobQueue.migrate()) first"
                )
            directory = os.path.dirname(self.path)
            if directory and not os.path.isdir(directory):
                raise DatabaseUnavailable(
                    f"SQLite database {self.path!r}: directory {directory!r} does not exist"
                )
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self.busy_timeout,
                    isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                    check_same_thread=False,
                )
                _retry_while_locked(
                    lambda: conn.execute("PRAGMA journal_mode = WAL"), self.busy_timeout
                )
                conn.execute("PRAGMA synchronous = FULL")
            except sqlite3.Error as exc:
                raise DatabaseUnavailable(f"SQLite database {self.path!r}: {exc}") from exc
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise DatabaseUnavailable(
                    f"SQLite database {self.path!r} stayed locked for more than "
                    f"busy_timeout={self.busy_timeout}s; nothing was written"
                ) from exc
            # A table or column a newer schema version adds: not migrated yet.
            if any(m in str(exc) for m in ("no such table", "no such column", "has no column")):
                raise DatabaseError(
                    f"SQLite: {exc} -- run `jobkeeper migrate` (or JobQueue.migrate()) first"
                ) from exc
            if any(word in str(exc).lower() for word in _PASSING_CONDITIONS):
                raise DatabaseUnavailable(f"SQLite database {self.path!r}: {exc}") from exc
            raise DatabaseError(f"SQLite error: {exc}") from exc
        except sqlite3.IntegrityError as exc:
            if "unique_key" in str(exc):
                raise UniqueKeyConflict(f"SQLite refused the data: {exc}") from exc
            raise DataRejected(f"SQLite refused the data: {exc}") from exc
        except sqlite3.DataError as exc:
            raise DataRejected(f"SQLite refused the data: {exc}") from exc
        except sqlite3.Error as exc:
            raise DatabaseError(f"SQLite error: {exc}") from exc

    @contextlib.contextmanager
    def _write(self, *, create: bool = False) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction, retried while the lock is busy.

        The connection's busy timeout already waits for the lock; the loop
        adds jittered retries for the cases SQLite reports BUSY at once, up
        to the same deadline (huey#445, solid_queue#309).
        """
        with self._errors():
            conn = self._conn(create=create)
            _retry_while_locked(lambda: conn.execute("BEGIN IMMEDIATE"), self.busy_timeout)
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._errors():
            return _rows(self._conn().execute(QUERIES[name], params or {}))

    def _jobs(self, rows: list[dict[str, Any]], *, dead: bool = False) -> list[Job]:
        return [job_from_row(row, epoch_to_datetime, dead=dead) for row in rows]

    def _probe(self, name: str, params: dict[str, Any] | None = None) -> bool:
        """Whether a periodic write has anything to do (see the ``*_probe``
        queries: a lock-free read, so idle polls take no write lock).
        """
        with self._errors():
            return self._conn().execute(QUERIES[name], params or {}).fetchone() is not None

    def dedicated(self) -> SqliteBackend:
        return SqliteBackend(self.url, busy_timeout=self.busy_timeout)

    def close(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(Exception):
                conn.close()
        self._local = threading.local()

    def wake_local(self) -> None:
        """Wake the workers of this process that use the same database file."""
        wakeups.wake(self.path)

    # -- schema -------------------------------------------------------------

    def migrate(self) -> int:
        with self._write(create=True) as conn:

            def execute(statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                return conn.execute(statement, params).fetchall()

            return apply_migrations(execute, MIGRATIONS, QUERIES)

    def schema_version(self) -> int:
        if not os.path.exists(self.path):
            return 0
        with self._errors():
            conn = self._conn()
            if not conn.execute(QUERIES["schema_exists"]).fetchone()[0]:
                return 0
            return int(conn.execute(QUERIES["schema_version"]).fetchone()[0])

    def db_now(self) -> datetime:
        with self._errors():
            value = self._conn().execute(QUERIES["db_now"]).fetchone()[0]
        return datetime.fromtimestamp(value, UTC)

    # -- jobs ---------------------------------------------------------------

    def job_insert_many(self, jobs: Sequence[NewJob], *, connection: Any = None) -> list[Job]:
        if not jobs:
            return []
        if connection is not None:
            self._check_same_database(connection)
            with self._errors():
                return self._insert_in_caller(connection, jobs)
        with self._write() as conn:
            result = self._insert(conn, jobs)
        if any(job.status == JobStatus.AVAILABLE for job in result):
            self.wake_local()
        return result

    def _check_same_database(self, connection: Any) -> None:
        if not isinstance(connection, sqlite3.Connection):
            raise TypeError(
                "connection= must be a sqlite3.Connection to the same database file, got "
                f"{type(connection).__module__}.{type(connection).__name__}"
            )
        with self._errors():
            rows = connection.execute("PRAGMA database_list").fetchall()
        main = next((row[2] for row in rows if row[1] == "main"), "")
        if not main or os.path.realpath(main) != os.path.realpath(self.path):
            raise TypeError(
                f"connection= is open on {main or 'an in-memory database'!r}, "
                f"not on this queue's database {self.path!r}"
            )

    def _insert_in_caller(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> list[Job]:
        """Insert on the caller's connection as one unit.

        A savepoint undoes a failed batch without touching the rest of the
        caller's transaction (so a caught error cannot commit half a batch).
        On an autocommit connection the savepoint is a transaction of its own,
        committed here: the write lock is held for the whole batch, so it is
        never half-written and the bulk path's ids stay consecutive.
        """
        autocommit = conn.isolation_level is None or getattr(conn, "autocommit", None) is True
        if not autocommit and not conn.in_transaction:
            # What sqlite3 itself would issue before the first INSERT; without
            # it, releasing the savepoint would commit the caller's work.
            conn.execute(f"BEGIN {conn.isolation_level}")
        conn.execute("SAVEPOINT jobkeeper_enqueue")
        try:
            out = self._insert(conn, jobs)
        except BaseException:
            conn.execute("ROLLBACK TO jobkeeper_enqueue")
            conn.execute("RELEASE jobkeeper_enqueue")
            raise
        conn.execute("RELEASE jobkeeper_enqueue")
        return out

    def _insert(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> list[Job]:
        if len(jobs) > 1 and all(new.unique_key is None for new in jobs):
            return self._insert_bulk(conn, jobs)
        out: list[Job] = []
        insert = QUERIES["job_insert"]
        for new in jobs:
            params = insert_params(new, new.run_at.timestamp() if new.run_at else None)
            inserted = self._jobs(_rows(conn.execute(insert, params)))
            existing: dict[tuple[str, str], Job] = {}
            if not inserted and new.unique_key is not None:
                # The write lock is ours, so the duplicate cannot finish meanwhile.
                found = _rows(
                    conn.execute(
                        QUERIES["job_get_pending_by_unique_key"],
                        {"task": new.task, "unique_key": new.unique_key},
                    )
                )
                existing = {(new.task, new.unique_key): self._jobs(found)[0]}
            matched, unresolved = match_inserted([new], inserted, existing)
            if unresolved or matched[0] is None:
                raise DatabaseError(
                    f"unique_key {new.unique_key!r}: conflict without a pending job"
                )
            out.append(matched[0])
        return out

    def _insert_bulk(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> list[Job]:
        """Insert with executemany, without RETURNING (no unique keys to resolve).

        The write lock is held from the first insert to the commit and
        AUTOINCREMENT takes max + 1, so the ids are consecutive and end at
        ``last_insert_rowid()``. The Jobs are built from the input and the
        clock read in the same transaction, which is also what is stored.
        """
        now_epoch = float(conn.execute(QUERIES["db_now"]).fetchone()[0])
        now = datetime.fromtimestamp(now_epoch, UTC)
        rows = []
        for new in jobs:
            status, scheduled_at = schedule_of(new, now)
            scheduled_epoch = now_epoch if scheduled_at is now else scheduled_at.timestamp()
            rows.append(
                (new.queue, new.task, new.args_json, status.value, new.priority,
                 new.max_attempts, scheduled_epoch, now_epoch)
            )  # fmt: skip
        conn.executemany(QUERIES["job_insert_bulk"], rows)
        last = int(conn.execute("SELECT last_insert_rowid()").fetchone()[0])
        first = last - len(jobs) + 1
        return [job_from_new(new, first + i, now) for i, new in enumerate(jobs)]

    def job_claim(self, *, worker_id: str, queue: str, limit: int) -> list[Job]:
        if not self._probe("job_claim_probe", {"queue": queue}):
            return []
        with self._write() as conn:
            rows = _rows(
                conn.execute(
                    QUERIES["job_claim"], {"worker_id": worker_id, "queue": queue, "limit": limit}
                )
            )
        return sorted(self._jobs(rows), key=lambda j: (j.priority, j.scheduled_at, j.id))

    def job_start_many(self, claims: Sequence[Claim]) -> set[int]:
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
                if conn.execute(QUERIES["job_start"], params).rowcount == 1:
                    written.add(job_id)
        return written

    def job_complete_many(self, completions: Sequence[Completion], *, delete: bool) -> set[int]:
        if not completions:
            return set()
        arrays = completion_arrays(completions)
        query = QUERIES["job_complete_delete" if delete else "job_complete"]
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

    def job_fail_many(
        self, failures: Sequence[Failure], *, stale_after: float | None = None
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
                    "outcome": failure.outcome,
                    "error": failure.error_json,
                    "retry_in": failure.retry_in,
                    "stale_after": stale_after,
                }
                if conn.execute(QUERIES["job_fail"], params).rowcount == 1:
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
                if conn.execute(QUERIES["job_fail_dead_cancelled"], cancelled).rowcount == 1:
                    written.add(failure.claim.job_id)
                elif conn.execute(QUERIES["job_fail_dead_copy"], params).rowcount == 1:
                    conn.execute(QUERIES["job_fail_dead_delete"], {"id": failure.claim.job_id})
                    written.add(failure.claim.job_id)
        if any(
            f.outcome in ("released", "returned") and f.claim.job_id in written for f in updates
        ):
            self.wake_local()
        return written

    def job_stage_due(self, *, queues: Sequence[str] = ()) -> Staging:
        (probe,) = self._fetch("job_stage_due_probe", {"queues": json.dumps(list(queues))})
        next_due_in = None if probe["next_due_in"] is None else float(probe["next_due_in"])
        if probe["due"] is None:
            return Staging(0, next_due_in)
        # A job coming due between the probe and the write is staged by the
        # write or comes due at next_due_in: no wake-up is missed either way.
        with self._write() as conn:
            staged = conn.execute(QUERIES["job_stage_due"], {"limit": STAGE_LIMIT}).rowcount
        if staged:
            self.wake_local()
        if staged >= STAGE_LIMIT:
            return Staging(staged, 0.0)  # more may be due: stage again at once
        return Staging(staged, next_due_in)

    def job_next_due_in(self, *, queues: Sequence[str]) -> float | None:
        with self._errors():
            value = (
                self._conn()
                .execute(QUERIES["job_next_due_in"], {"queues": json.dumps(list(queues))})
                .fetchone()[0]
            )
        return None if value is None else float(value)

    def job_prune_finished(self, *, older_than: float, limit: int) -> int:
        if not self._probe("job_prune_finished_probe", {"older_than": older_than}):
            return 0
        with self._write() as conn:
            return conn.execute(
                QUERIES["job_prune_finished"], {"older_than": older_than, "limit": limit}
            ).rowcount

    def job_table_maintain(self, *, vacuum: bool) -> list[str]:
        # SQLite rewrites rows in place (no dead versions pile up in indexes),
        # and its planner needs no statistics to use the claim index.
        return []

    def job_cancel(self, job_id: int) -> Job | None:
        with self._write() as conn:
            rows = _rows(conn.execute(QUERIES["job_cancel"], {"id": job_id}))
        return self._jobs(rows)[0] if rows else self.job_get(job_id)

    def job_retry(self, job_id: int) -> Job | None:
        with self._write() as conn:
            rows = _rows(conn.execute(QUERIES["job_retry"], {"id": job_id}))
            if not rows:
                self._requeue(conn, [job_id])
        self.wake_local()
        return self.job_get(job_id)

    def _requeue_params(self, job_ids: Sequence[int] | None) -> dict[str, Any]:
        """Which dead letters a requeue takes (``None``: all of them)."""
        return {"all": job_ids is None, "ids": json.dumps(list(job_ids or []))}

    def _requeue(self, conn: sqlite3.Connection, job_ids: Sequence[int] | None) -> list[int]:
        params = self._requeue_params(job_ids)
        revived = [
            row["id"] for row in _rows(conn.execute(QUERIES["dead_letter_requeue_copy"], params))
        ]
        conn.execute(QUERIES["dead_letter_requeue_delete"], {"ids": json.dumps(revived)})
        return sorted(revived)

    def dead_letter_requeue(self, job_ids: Sequence[int] | None) -> list[int]:
        with self._write() as conn:
            ids = self._requeue(conn, job_ids)
        if ids:
            self.wake_local()
        return ids

    def queue_stats(self) -> dict[str, dict[str, int]]:
        stats: dict[str, dict[str, int]] = {}
        with self._errors():
            for queue, status, count in self._conn().execute(QUERIES["queue_stats"]):
                stats.setdefault(queue, {})[status] = int(count)
        return stats

    # -- workers ------------------------------------------------------------

    def worker_register(self, worker: WorkerInfo) -> None:
        with self._write() as conn:
            conn.execute(QUERIES["worker_register"], self._worker_params(worker))

    def worker_heartbeat(self, worker: WorkerInfo) -> None:
        # One autocommit statement: SQLite takes the write lock and commits
        # inside a single step, so the lock is never held while this thread
        # waits for the GIL between BEGIN, UPDATE and COMMIT.
        with self._errors():
            conn = self._conn()
            if conn.in_transaction:
                # Only after a ROLLBACK that itself failed: a beat must never
                # join (and vanish with) a transaction nobody will commit.
                conn.execute("ROLLBACK")
            updated = _retry_while_locked(
                lambda: conn.execute(QUERIES["worker_heartbeat"], {"id": worker.id}).rowcount,
                self.busy_timeout,
            )
        if updated == 0:
            # Pruned while paused: come back; old claims stay fenced off.
            with self._write() as conn:
                conn.execute(QUERIES["worker_register"], self._worker_params(worker))

    def worker_deregister(self, worker_id: str) -> None:
        with self._write() as conn:
            conn.execute(QUERIES["worker_deregister"], {"id": worker_id})

    def worker_prune_stale(self, *, older_than: float) -> int:
        if not self._probe("worker_prune_stale_probe", {"older_than": older_than}):
            return 0
        with self._write() as conn:
            return conn.execute(QUERIES["worker_prune_stale"], {"older_than": older_than}).rowcount

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=row["id"],
                hostname=row["hostname"],
                pid=row["pid"],
                queues=json.loads(row["queues"]),
                started_at=datetime.fromtimestamp(row["started_at"], UTC),
                heartbeat_at=datetime.fromtimestamp(row["heartbeat_at"], UTC),
                rescue_after=row["rescue_after"],
            )
            for row in self._fetch("worker_list")
        ]

    # -- leadership -----------------------------------------------------------

    def leader_try_acquire(self, *, name: str, worker_id: str, ttl: float) -> bool:
        params = {"name": name, "worker_id": worker_id, "ttl": ttl}
        with self._write() as conn:
            return bool(conn.execute(QUERIES["leader_try_acquire"], params).fetchall())

    def leader_resign(self, *, name: str, worker_id: str) -> None:
        with self._write() as conn:
            conn.execute(QUERIES["leader_resign"], {"name": name, "worker_id": worker_id})

    def leader_get(self, *, name: str) -> str | None:
        rows = self._fetch("leader_get", {"name": name})
        return str(rows[0]["worker_id"]) if rows else None

    # -- wake-ups -----------------------------------------------------------

    def listen(
        self,
        on_queue: Callable[[str], None],
        stop: threading.Event,
        *,
        on_due: Callable[[str, float], None] | None = None,
    ) -> None:
        """See the Backend Protocol and :mod:`.wakeups` (``on_due`` is never
        called: SQLite sends no due times, a change of the file stands in).
        """

        def data_version() -> int:
            with self._errors():
                return int(self._conn().execute("PRAGMA data_version").fetchone()[0])

        wakeups.listen(self.path, data_version, on_queue, stop)

    # -- dashboard, /metrics, doctor ----------------------------------------

    def _ids_param(self, job_ids: Sequence[int] | None) -> Any:
        return json_ids(job_ids)

    def dead_letter_purge(
        self, *, job_ids: Sequence[int] | None, older_than: float | None
    ) -> list[int]:
        # A write like any other: under BEGIN IMMEDIATE, with its lock retries.
        params = {"ids": json_ids(job_ids), "all_ids": job_ids is None, "older_than": older_than}
        with self._write() as conn:
            rows = _rows(conn.execute(QUERIES["dead_letter_purge"], params))
        return sorted(int(row["id"]) for row in rows)

    def _count_estimate(self, status: str, cap: int, share: float) -> int | None:
        name = "queue_counts_estimate_dead" if status == "dead" else "queue_counts_estimate"
        row = self._fetch(name, {"cap": cap})[0]
        oldest, sample_oldest, newest = row["oldest"], row["sample_oldest"], row["now"]
        if oldest is None or sample_oldest is None or newest is None or newest <= sample_oldest:
            return None
        return round(float(share * cap * (newest - oldest) / (newest - sample_oldest)))

    def database_health(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "backend": self.name,
            "schema_version": self.schema_version(),
            "schema_expected": MIGRATIONS[-1][0],
        }
        if facts["schema_version"] == 0:
            return facts
        with self._errors():
            conn = self._conn()
            facts["journal_mode"] = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
            facts["busy_timeout_ms"] = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
            plan = conn.execute(
                QUERIES["database_health_claim_plan"], {"queue": "default"}
            ).fetchall()
        facts["claim_plan"] = "; ".join(str(row[-1]) for row in plan)
        facts["claim_uses_index"] = "jobkeeper_jobs_claim_idx" in facts["claim_plan"]
        wal = self.path + "-wal"
        facts["wal_bytes"] = os.path.getsize(wal) if os.path.exists(wal) else 0
        return facts

    # -- periodic jobs ------------------------------------------------------

    def periodic_upsert(self, *, periodics: Sequence[Periodic]) -> None:
        if not periodics:
            return
        with self._write() as conn:
            for periodic in sorted(periodics, key=lambda p: p.name):
                conn.execute(
                    QUERIES["periodic_upsert"],
                    {
                        "name": periodic.name,
                        "schedule": str(periodic.schedule),
                        "timezone": periodic.schedule.timezone,
                        "task": periodic.task,
                        "queue": periodic.queue,
                        "priority": periodic.priority,
                        "max_attempts": periodic.max_attempts,
                        "args": periodic.args_json,
                        "catch_up": periodic.catch_up,
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
            "tick": tick.timestamp(),
            "next_tick": None if next_tick is None else next_tick.timestamp(),
        }
        # One BEGIN IMMEDIATE: the record and the job commit together, and a
        # twin waits for the write lock, then finds the tick recorded.
        with self._write() as conn:
            template = _rows(conn.execute(QUERIES["periodic_enqueue_tick"], params))
            if not template:
                return None
            row = template[0]
            inserted = conn.execute(
                QUERIES["periodic_enqueue_job"],
                {
                    "queue": row["queue"],
                    "task": row["task"],
                    "args": row["args"],
                    "priority": row["priority"],
                    "max_attempts": row["max_attempts"],
                    "tick": params["tick"],
                },
            ).fetchone()
        self.wake_local()
        return int(inserted[0])

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
            "through": through.timestamp(),
            "next_tick": None if next_tick is None else next_tick.timestamp(),
        }
        with self._write() as conn:
            return bool(conn.execute(QUERIES["periodic_skip"], params).fetchall())

    def periodic_touch(self, *, touches: Sequence[PeriodicTouch]) -> set[str]:
        if not touches:
            return set()
        touched: set[str] = set()
        with self._write() as conn:
            for touch in touches:
                params = {
                    "name": touch.name,
                    "schedule": touch.schedule,
                    "timezone": touch.timezone,
                    "next_tick": None
                    if touch.next_tick_at is None
                    else touch.next_tick_at.timestamp(),
                }
                if conn.execute(QUERIES["periodic_touch"], params).fetchall():
                    touched.add(touch.name)
        return touched

    def periodic_list(self, *, stale_after: float) -> list[PeriodicRow]:
        rows = self._fetch("periodic_list", {"stale_after": stale_after})
        return [periodic_from_row(row, epoch_to_datetime) for row in rows]

    def periodic_prune(self, *, stale_after: float) -> list[str]:
        with self._write() as conn:
            rows = conn.execute(QUERIES["periodic_prune"], {"stale_after": stale_after}).fetchall()
        return sorted(row[0] for row in rows)
