"""PostgreSQL backend: psycopg 3, a connection pool for API calls, dedicated
connections for worker threads, LISTEN/NOTIFY wake-ups.

Claims use ``FOR UPDATE SKIP LOCKED`` so any number of workers on any number
of hosts share the queue without blocking each other.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import secrets
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from jobkeeper.backends.cockpit import CockpitReads
from jobkeeper.backends.migrate import apply_migrations
from jobkeeper.backends.rows import (
    STAGE_LIMIT,
    aware_utc,
    claim_arrays,
    completion_arrays,
    insert_params,
    job_from_new,
    job_from_row,
    match_inserted,
    split_failures,
)
from jobkeeper.backends.shared import SharedReads
from jobkeeper.backends.sqlfile import load_migrations, load_queries
from jobkeeper.config import DatabaseURL
from jobkeeper.errors import (
    DatabaseError,
    DatabaseUnavailable,
    DataRejected,
    UniqueKeyConflict,
)
from jobkeeper.models import Claim, Completion, Failure, Job, JobStatus, NewJob, Staging, WorkerInfo
from jobkeeper.payload import decode_args
from jobkeeper.periodic import Periodic, PeriodicRow, PeriodicTouch, periodic_from_row

logger = logging.getLogger("jobkeeper.postgres")
# The pool logs every failed reconnect during an outage. An application that
# configured logging still gets those records (they propagate to its
# handlers); one that did not would get them dumped raw on stderr by
# logging's last-resort handler, beside the DatabaseUnavailable it catches.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

UTC_NOW_TEXT_SQL = """to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
QUERIES = {
    name: text.replace("{utc_now_text}", UTC_NOW_TEXT_SQL)
    for name, text in load_queries("jobkeeper.backends.postgres").items()
}
#: Each migration file runs as one statement (PostgreSQL takes several at once).
MIGRATIONS = [
    (version, [script])
    for version, script in load_migrations("jobkeeper.backends.postgres.migrations")
]

#: pg_advisory_xact_lock key serialising migrate() across processes
#: (the bytes of "jobkeepr" as a big-endian int64).
MIGRATION_LOCK_KEY = 0x6A6F626B65657072
#: Seconds an API call waits for a pooled connection (or a connection to be
#: made) before raising DatabaseUnavailable.
POOL_TIMEOUT = 10.0
#: Seconds between probes of the server while waiting for a pooled connection.
POOL_SLICE = 0.5
CONNECT_TIMEOUT = 5
#: No server-side prepared statements (psycopg prepares a query from its 5th
#: run otherwise): behind a pooler in transaction mode (PgBouncer before 1.21,
#: or without max_prepared_statements) one connection's statements reach
#: different server sessions, where a prepared name is missing, taken, or
#: names another statement entirely.
PREPARE_THRESHOLD = None
#: Seconds a pooled connection may sit idle before it is pinged on checkout.
IDLE_CHECK_AFTER = 1.0
#: Batches at least this large (and without unique keys) are written with COPY.
COPY_MIN_JOBS = 64
#: An insert of our own transaction that PostgreSQL aborts asking for a retry
#: (a deadlock, a serialization failure) is retried this many times, after a
#: jittered pause of up to ``INSERT_RETRY_PAUSE * 2**n`` seconds.
INSERT_RETRIES = 5
INSERT_RETRY_PAUSE = 0.02
#: What jobkeeper asks of libpq unless the URL (or ``PGTARGETSESSIONATTRS``)
#: says otherwise: a session that can write. A demoted primary, a standby, a
#: server with ``default_transaction_read_only`` is refused at connect (and,
#: with several hosts in the URL, the writable one is found), instead of
#: failing every write of a session that looks healthy.
TARGET_SESSION_ATTRS = "read-write"
#: Listener canary: seconds between self-notifications, seconds to wait for
#: the echo, and fresh connections without any echo before giving up on LISTEN.
CANARY_INTERVAL = 10.0
CANARY_TIMEOUT = 5.0
CANARY_GIVE_UP = 3
CANARY_PREFIX = "~canary:"  # "~" is not allowed in queue names


def _rows(cursor: psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    # Column names straight from the result: cursor.description builds a
    # Column object per column on every call, which showed in claim profiles.
    result = cursor.pgresult
    if result is None or result.nfields == 0:
        return []
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


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
     unstarted_returns) = row  # fmt: skip
    args, args_error = decode_args(args_text)
    errors = [] if errors_text is None else _JSON.decode(errors_text)
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
    )


def _has_unread_input(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server sent anything to this idle connection (without reading it)."""
    try:
        fd = conn.fileno()
        if not hasattr(select, "poll"):  # Windows
            return bool(select.select([fd], [], [fd], 0)[0])
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True  # no usable socket: let the ping decide


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _with_session_attrs(conninfo: str) -> str:
    """``conninfo`` asking for a writable session, unless the user chose."""
    if "PGTARGETSESSIONATTRS" in os.environ or "target_session_attrs" in conninfo_to_dict(conninfo):
        return conninfo
    separator = "&" if "?" in conninfo else "?"
    return f"{conninfo}{separator}target_session_attrs={TARGET_SESSION_ATTRS}"


#: Errors after which a session is given up. A read-only session stays so for
#: its whole life (PostgreSQL reads default_transaction_read_only at session
#: start; a server in recovery stays in it): retrying on it wedged workers
#: after a failover even once the address led to a writable server again.
_LOST_SESSION = (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction)
#: What PostgreSQL aborts a transaction with, asking for it to be run again.
_RETRY_ASKED = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def _retry_asked(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, _RETRY_ASKED)


def _retrying(run: Callable[[], list[Job]]) -> list[Job]:
    """``run()``, run again (up to ``INSERT_RETRIES`` times, after a jittered
    pause) when PostgreSQL aborted its transaction asking for a retry. Only
    for transactions of our own: nothing of an aborted one was written.
    """
    for retry in range(INSERT_RETRIES):
        try:
            return run()
        except DatabaseError as exc:
            if not _retry_asked(exc):
                raise
            logger.debug("insert aborted (%s); running it again", exc)
        time.sleep(random.uniform(0, INSERT_RETRY_PAUSE * 2**retry))
    return run()


def _unique_lock_key(task: str, unique_key: str) -> int:
    """The advisory lock key of a (task, unique_key): a stable 64-bit hash
    (Python's ``hash`` differs between processes). A collision only makes two
    batches wait for each other; uniqueness itself is the index's.
    """
    digest = hashlib.blake2b(f"{task}\0{unique_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _SingleConnection:
    """One lazily (re)opened connection for one worker thread.

    After a connection error the connection is dropped and the next use
    reconnects, so a worker survives a database restart or
    ``pg_terminate_backend`` by retrying its loop.
    """

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.Connection[Any] | None = None

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop()
            self._conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT,
                prepare_threshold=PREPARE_THRESHOLD,
            )
        try:
            yield self._conn
        except _RETRY_ASKED:
            raise  # the transaction failed, not the session
        except _LOST_SESSION:
            self._drop()
            raise

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        self._drop()


class _PooledConnections:
    """A psycopg_pool pool, opened on first use, checking connections on
    checkout so a restarted server costs no failed API call.
    """

    def __init__(self, conninfo: str, max_size: int) -> None:
        self._conninfo = conninfo
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                "connect_timeout": CONNECT_TIMEOUT,
                "prepare_threshold": PREPARE_THRESHOLD,
            },
            timeout=POOL_TIMEOUT,
            open=False,
            name="jobkeeper",
        )
        self._opened = False
        #: Set after a failure that may mean the server is gone: the next
        #: checkout probes with a direct connection first.
        self._suspect = False
        self._lock = threading.Lock()
        self._returned_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = (
            weakref.WeakKeyDictionary()
        )

    def _alive(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether a connection just checked out can be used, pinging it only
        when it may have been cut.

        A connection that idled for a while may have been cut by a server
        restart or failover without a word. One used a moment ago was alive
        then, and a server that ends a session (restart, ``pg_terminate_
        backend``, an idle timeout) first sends the reason on the socket: an
        idle connection whose socket is readable is suspect. Both get a ping.
        The readability test is one ``poll`` system call; a ping on every
        checkout cost a round trip per enqueue.
        """
        idle = time.monotonic() - self._returned_at.get(conn, 0.0) > IDLE_CHECK_AFTER
        if not idle and not _has_unread_input(conn):
            return True
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error:
            return False
        return True

    def _probe(self) -> None:
        """Connect directly once: raises at once (libpq's own reason) when
        the server is unreachable, instead of letting the caller wait out
        the pool's timeout while it retries in the background.
        """
        psycopg.connect(self._conninfo, connect_timeout=CONNECT_TIMEOUT).close()
        self._suspect = False

    def _getconn(self) -> psycopg.Connection[Any]:
        """A live pooled connection; waits up to ``POOL_TIMEOUT`` when the
        pool is busy, but fails within about ``POOL_SLICE`` when the server
        is down.

        Dead connections (see :meth:`_alive`) are closed and handed back, and
        the pool opens replacements at once. The pool's own ``check`` hook is
        not used for this: after two failed checks it backs off for a second,
        so the first call after a restart waited out a whole slice.
        """
        deadline = time.monotonic() + POOL_TIMEOUT
        while True:
            if self._suspect:
                self._probe()
            remaining = deadline - time.monotonic()
            try:
                conn = self._pool.getconn(timeout=max(min(POOL_SLICE, remaining), 0.001))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise
                # Busy, or the server went away: a probe tells which.
                self._suspect = True
                continue
            if self._alive(conn):
                return conn
            # Cut: the server may be gone; the probe says so at once if it is.
            self._suspect = True
            conn.close()
            self._pool.putconn(conn)
            if time.monotonic() >= deadline:
                raise PoolTimeout(f"no live connection within {POOL_TIMEOUT:g}s")

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if not self._opened:
            with self._lock:
                if not self._opened:
                    self._probe()
                    self._pool.open(wait=False)
                    self._opened = True
        conn = self._getconn()
        try:
            with conn:
                yield conn
        except _RETRY_ASKED:
            raise
        except psycopg.errors.ReadOnlySqlTransaction:
            # Every session of the pool was opened to the server that now
            # refuses writes: replace them all, not one per failed call.
            # The probe on the next checkout reports read-only at once.
            self._suspect = True
            conn.close()
            self._pool.drain()
            raise
        except psycopg.OperationalError:
            self._suspect = True
            raise
        finally:
            # Noted here, not in a pool ``reset`` callback: with one, the
            # pool hands every returned connection to a worker thread,
            # which cost ~150 us of CPU and latency per API call.
            self._returned_at[conn] = time.monotonic()
            self._pool.putconn(conn)

    def close(self) -> None:
        if self._opened:
            self._pool.close()
            self._opened = False


class PostgresBackend(SharedReads, CockpitReads):
    """The PostgreSQL implementation of :class:`~jobkeeper.backends.base.Backend`.

    Args:
        url: the parsed ``postgresql://`` URL.
        dedicated: use one private connection instead of a pool.
        pool_size: most pooled connections for API calls.
    """

    name = "postgresql"

    def __init__(self, url: DatabaseURL, *, dedicated: bool = False, pool_size: int = 10) -> None:
        self.url = url
        self._conninfo = _with_session_attrs(url.url.replace("postgres://", "postgresql://", 1))
        self._source: _SingleConnection | _PooledConnections = (
            _SingleConnection(self._conninfo)
            if dedicated
            else _PooledConnections(self._conninfo, pool_size)
        )
        self._channel: str | None = None
        self._warned_autovacuum_off = False
        # Caller connections already checked (weak: closing them forgets them).
        self._checked_connections: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()

    # -- plumbing -----------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Translate driver errors into jobkeeper's, naming the server."""
        try:
            yield
        except _RETRY_ASKED as exc:
            # Not the server's health: the transaction lost a race (callers
            # that own the transaction retry it, see job_insert_many).
            raise DatabaseError(
                f"PostgreSQL aborted the transaction ({_describe(exc)}); running it again "
                "may succeed"
            ) from exc
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise DatabaseUnavailable(
                f"PostgreSQL at {self.url.redacted()} is read-only (a standby, a demoted "
                f"primary, or default_transaction_read_only=on): {_describe(exc)}; "
                "the session was dropped and the next call reconnects"
            ) from exc
        except (
            psycopg.OperationalError,
            PoolTimeout,
            # Conditions that pass, not properties of the call: a full
            # disk, no memory.
            psycopg.errors.InsufficientResources,
        ) as exc:
            raise DatabaseUnavailable(
                f"PostgreSQL at {self.url.redacted()} is unavailable: {_describe(exc)}"
            ) from exc
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name == "jobkeeper_jobs_unique_idx":
                raise UniqueKeyConflict(f"PostgreSQL refused the data: {_describe(exc)}") from exc
            raise DataRejected(f"PostgreSQL refused the data: {_describe(exc)}") from exc
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise DataRejected(f"PostgreSQL refused the data: {_describe(exc)}") from exc
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            raise DatabaseError(
                f"{_describe(exc)} -- run `jobkeeper migrate` (or JobQueue.migrate()) first"
            ) from exc
        except psycopg.Error as exc:
            raise DatabaseError(f"PostgreSQL error: {_describe(exc)}") from exc

    @contextlib.contextmanager
    def _cursor(self, *, transaction: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        with self._errors(), self._source.connection() as conn:
            if transaction:
                with conn.transaction(), conn.cursor(row_factory=tuple_row) as cursor:
                    yield cursor
            else:
                with conn.cursor(row_factory=tuple_row) as cursor:
                    yield cursor

    def _fetch(
        self, name: str, params: dict[str, Any] | None = None, *, binary: bool = False
    ) -> list[dict[str, Any]]:
        with self._cursor() as cursor:
            cursor.execute(QUERIES[name], params or {}, binary=binary)
            return _rows(cursor)

    def _jobs(self, rows: list[dict[str, Any]], *, dead: bool = False) -> list[Job]:
        return [job_from_row(row, aware_utc, dead=dead, json_decoded=True) for row in rows]

    def channel(self) -> str:
        """The NOTIFY channel: ``jobkeeper_<schema>``, or ``jobkeeper_<md5 of
        the schema>`` when that would pass the 63-byte identifier limit (the
        same rule as the insert trigger's).
        """
        if self._channel is None:
            rows = self._fetch_raw("SELECT current_schema()")
            schema = rows[0][0] if rows else None
            if schema is None:
                raise DatabaseError(
                    "PostgreSQL has no current schema (check search_path in the URL)"
                )
            if len(schema.encode()) > 53:
                schema = hashlib.md5(schema.encode()).hexdigest()
            self._channel = f"jobkeeper_{schema}"
        return self._channel

    def _fetch_raw(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def dedicated(self) -> PostgresBackend:
        return PostgresBackend(self.url, dedicated=True)

    def close(self) -> None:
        self._source.close()

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

    def job_insert_many(self, jobs: Sequence[NewJob], *, connection: Any = None) -> list[Job]:
        if not jobs:
            return []
        delayed = any(j.delay is not None or j.run_at is not None for j in jobs)
        channel = self.channel() if delayed else None  # looked up before a cursor is held
        if connection is not None:
            return self._insert_on(connection, jobs, channel)
        # Without unique keys, COPY or delayed jobs (their NOTIFY is a second
        # statement) the insert is one statement, atomic on its own: no
        # BEGIN/COMMIT round trips around it.
        single_statement = (
            len(jobs) < COPY_MIN_JOBS and not delayed and all(j.unique_key is None for j in jobs)
        )

        def insert() -> list[Job]:
            with self._cursor(transaction=not single_statement) as cursor:
                return self._notify_due(cursor, channel, self._insert(cursor, jobs))

        return _retrying(insert)

    def _insert_on(self, connection: Any, jobs: Sequence[NewJob], channel: str | None) -> list[Job]:
        """``job_insert_many`` on the caller's connection (``connection=``)."""
        if not isinstance(connection, psycopg.Connection):
            raise TypeError(
                "connection= must be a psycopg 3 Connection to this database, got "
                f"{type(connection).__module__}.{type(connection).__name__}"
            )
        # On an autocommit connection the block below is a transaction of its
        # own, which may be run again; otherwise it is a savepoint in the
        # caller's transaction, which an abort ends whole.
        own = connection.autocommit

        def insert() -> list[Job]:
            with self._errors():
                self._check_same_database(connection)
                if not own:
                    # Make sure the caller's transaction is open, so that the
                    # block below is a savepoint inside it rather than a
                    # transaction of its own that would commit.
                    connection.execute("SELECT 1")
                # A savepoint (or a transaction): a batch that fails part-way
                # leaves nothing behind.
                try:
                    with connection.transaction(), connection.cursor(row_factory=tuple_row) as cur:
                        return self._notify_due(cur, channel, self._insert(cur, jobs))
                except _RETRY_ASKED as exc:
                    if own:
                        raise
                    raise DatabaseError(
                        f"PostgreSQL aborted the caller's transaction ({_describe(exc)}): "
                        "roll it back and retry the whole transaction (none of it was committed)"
                    ) from exc

        return _retrying(insert) if own else insert()

    def _notify_due(
        self, cursor: psycopg.Cursor[Any], channel: str | None, jobs: list[Job]
    ) -> list[Job]:
        """Tell listening workers when the scheduled jobs among ``jobs`` come
        due (one NOTIFY per queue, in the insert's transaction), so that they
        stage them then rather than at their next poll. Returns ``jobs``.
        """
        due: dict[str, datetime] = {}
        for job in jobs:
            if job.status == JobStatus.SCHEDULED:
                due[job.queue] = min(due.get(job.queue, job.scheduled_at), job.scheduled_at)
        if channel is not None and due:
            cursor.execute(
                QUERIES["notify_due"],
                {"channel": channel, "queues": list(due), "due_ats": list(due.values())},
            )
        return jobs

    def _check_same_database(self, connection: psycopg.Connection[Any]) -> None:
        """Refuse a caller's connection to another database or schema."""
        if connection in self._checked_connections:
            return
        query = "SELECT current_database(), current_schema()"
        theirs = connection.execute(query).fetchone()
        ours = self._fetch_raw(query)[0]
        if theirs is None or tuple(theirs) != tuple(ours):
            raise TypeError(
                f"connection= is open on database/schema {tuple(theirs or ())!r}, not on "
                f"this queue's {tuple(ours)!r}"
            )
        self._checked_connections.add(connection)

    def _insert(self, cursor: psycopg.Cursor[Any], jobs: Sequence[NewJob]) -> list[Job]:
        if len(jobs) >= COPY_MIN_JOBS and all(job.unique_key is None for job in jobs):
            return self._insert_copy(cursor, jobs)
        if len(jobs) == 1 and jobs[0].unique_key is None:
            return [self._insert_one(cursor, jobs[0])]
        lock_keys = sorted(
            {_unique_lock_key(j.task, j.unique_key) for j in jobs if j.unique_key is not None}
        )
        if len(lock_keys) > 1:
            # Rows go in input order (ids ascend with it), so two batches
            # holding the same keys in different orders would each wait in
            # the unique index for a key the other took first: a deadlock.
            # The locks are taken in one order for all batches instead.
            cursor.execute(QUERIES["job_lock_unique_keys"], {"keys": lock_keys})
        out: list[Job | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        # A duplicate can finish between the skipped insert and the lookup;
        # then the key is free again and the next round inserts it.
        for _ in range(5):
            batch = [jobs[i] for i in pending]
            cursor.execute(
                QUERIES["job_insert_many"],
                {
                    "queues": [j.queue for j in batch],
                    "tasks": [j.task for j in batch],
                    "args": [j.args_json for j in batch],
                    "priorities": [j.priority for j in batch],
                    "max_attempts": [j.max_attempts for j in batch],
                    "delays": [j.delay for j in batch],
                    "run_ats": [j.run_at for j in batch],
                    "unique_keys": [j.unique_key for j in batch],
                },
            )
            inserted = self._jobs(_rows(cursor))
            existing: dict[tuple[str, str], Job] = {}
            if len(inserted) < len(batch):
                keyed = [j for j in batch if j.unique_key is not None]
                cursor.execute(
                    QUERIES["job_get_pending_by_unique_key"],
                    {
                        "tasks": [j.task for j in keyed],
                        "unique_keys": [j.unique_key for j in keyed],
                    },
                )
                for job in self._jobs(_rows(cursor)):
                    assert job.unique_key is not None
                    existing[(job.task, job.unique_key)] = job
            matched, unresolved = match_inserted(batch, inserted, existing)
            for position, matched_job in zip(pending, matched, strict=True):
                out[position] = matched_job
            pending = [pending[i] for i in unresolved]
            if not pending:
                return [job for job in out if job is not None]
        raise DatabaseError("could not resolve unique_key conflicts after 5 rounds")

    def _insert_one(self, cursor: psycopg.Cursor[Any], new: NewJob) -> Job:
        """The single enqueue: one statement, and no row to decode (the args
        go back as the caller gave them, like the COPY path's).
        """
        cursor.execute(QUERIES["job_insert_one"], insert_params(new, new.run_at))
        row = cursor.fetchone()
        assert row is not None
        job_id, status, scheduled_at, created_at = row
        return job_from_new(
            new,
            job_id,
            created_at.astimezone(UTC),
            (JobStatus(status), scheduled_at.astimezone(UTC)),
        )

    def _insert_copy(self, cursor: psycopg.Cursor[Any], jobs: Sequence[NewJob]) -> list[Job]:
        """Bulk insert with COPY (no unique keys to resolve): three round trips
        whatever the count. The insert trigger still sends one NOTIFY per queue.
        """
        cursor.execute(QUERIES["job_reserve_ids"], {"count": len(jobs)})
        row = cursor.fetchone()
        assert row is not None
        now, ids = row[0].astimezone(UTC), row[1]
        built = [job_from_new(new, job_id, now) for new, job_id in zip(jobs, ids, strict=True)]
        pairs = list(zip(jobs, built, strict=True))
        immediate = [(new, job) for new, job in pairs if new.delay is None and new.run_at is None]
        if immediate:
            with cursor.copy(QUERIES["job_copy_in"]) as copy:
                for new, job in immediate:
                    copy.write_row(
                        (job.id, new.queue, new.task, new.args_json, new.priority, new.max_attempts)
                    )
        if len(immediate) < len(pairs):
            with cursor.copy(QUERIES["job_copy_in_scheduled"]) as copy:
                for new, job in pairs:
                    if new.delay is not None or new.run_at is not None:
                        copy.write_row(
                            (job.id, new.queue, new.task, new.args_json, job.status.value,
                             new.priority, new.max_attempts, job.scheduled_at, now)
                        )  # fmt: skip
        return built

    def job_claim(self, *, worker_id: str, queue: str, limit: int) -> list[Job]:
        # Binary results: timestamps and integers decode without text parsing.
        params = {"worker_id": worker_id, "queue": queue, "limit": limit}
        with self._cursor() as cursor:
            cursor.execute(QUERIES["job_claim"], params, binary=True)
            utc: dict[datetime, datetime] = {}
            jobs = [claimed_job(row, worker_id, utc) for row in cursor.fetchall()]
        return sorted(jobs, key=lambda j: (j.priority, j.scheduled_at, j.id))

    def job_start_many(self, claims: Sequence[Claim]) -> set[int]:
        if not claims:
            return set()
        return {row["id"] for row in self._fetch("job_start_many", claim_arrays(claims))}

    def job_complete_many(self, completions: Sequence[Completion], *, delete: bool) -> set[int]:
        if not completions:
            return set()
        params = completion_arrays(completions)
        if delete:
            del params["results"]
        name = "job_complete_delete_many" if delete else "job_complete_many"
        return {row["id"] for row in self._fetch(name, params)}

    def job_fail_many(
        self, failures: Sequence[Failure], *, stale_after: float | None = None
    ) -> set[int]:
        if not failures:
            return set()
        dead, updates = split_failures(failures)
        written: set[int] = set()
        with self._cursor(transaction=True) as cursor:
            if updates:
                cursor.execute(
                    QUERIES["job_fail_many"],
                    {
                        "ids": [f.claim.job_id for f in updates],
                        "worker_ids": [f.claim.worker_id for f in updates],
                        "attempts": [f.claim.attempt for f in updates],
                        "fences": [f.claim.fence for f in updates],
                        "outcomes": [f.outcome for f in updates],
                        "errors": [f.error_json for f in updates],
                        "retry_ins": [f.retry_in for f in updates],
                        "stale_after": stale_after,
                    },
                )
                written.update(row[0] for row in cursor.fetchall())
            if dead:
                cursor.execute(QUERIES["job_lock_many"], {"ids": [f.claim.job_id for f in dead]})
                cursor.execute(
                    QUERIES["job_fail_dead_many"],
                    {
                        "ids": [f.claim.job_id for f in dead],
                        "worker_ids": [f.claim.worker_id for f in dead],
                        "attempts": [f.claim.attempt for f in dead],
                        "fences": [f.claim.fence for f in dead],
                        "errors": [f.error_json for f in dead],
                        "reasons": [f.reason or "max_attempts exhausted" for f in dead],
                        "stale_after": stale_after,
                    },
                )
                written.update(row[0] for row in cursor.fetchall())
            released = {
                f.claim.job_id for f in updates if f.outcome in ("released", "returned")
            } & written
            if released:
                queues = {row["queue"] for row in self._released_queues(cursor, released)}
                cursor.execute(
                    QUERIES["notify_queues"], {"channel": self.channel(), "queues": sorted(queues)}
                )
        return written

    def _released_queues(self, cursor: psycopg.Cursor[Any], ids: set[int]) -> list[dict[str, Any]]:
        cursor.execute(
            "SELECT DISTINCT queue FROM jobkeeper_jobs WHERE id = ANY(%s)", (sorted(ids),)
        )
        return _rows(cursor)

    def job_stage_due(self, *, queues: Sequence[str] = ()) -> Staging:
        params = {"channel": self.channel(), "limit": STAGE_LIMIT, "queues": list(queues)}
        (row,) = self._fetch("job_stage_due", params)
        staged, next_due_in = int(row["staged"]), row["next_due_in"]
        if staged >= STAGE_LIMIT:
            return Staging(staged, 0.0)  # more may be due: stage again at once
        return Staging(staged, None if next_due_in is None else float(next_due_in))

    def job_next_due_in(self, *, queues: Sequence[str]) -> float | None:
        result = self._fetch("job_next_due_in", {"queues": list(queues)})
        value = next(iter(result[0].values())) if result else None
        return None if value is None else float(value)

    def job_prune_finished(self, *, older_than: float, limit: int) -> int:
        with self._cursor() as cursor:
            cursor.execute(
                QUERIES["job_prune_finished"], {"older_than": older_than, "limit": limit}
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
        rows = self._fetch_raw(QUERIES["job_table_stats"])
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
            self._fetch_raw(QUERIES["job_table_vacuum"])
            return ["vacuum", "analyze"]
        if not analyzed or (not autovacuum and changed > max(1000, live // 10)):
            self._fetch_raw(QUERIES["job_table_analyze"])
            return ["analyze"]
        return []

    def job_cancel(self, job_id: int) -> Job | None:
        rows = self._fetch("job_cancel", {"id": job_id})
        return self._jobs(rows)[0] if rows else self.job_get(job_id)

    def job_retry(self, job_id: int) -> Job | None:
        rows = self._fetch("job_retry", {"id": job_id})
        if not rows and self.dead_letter_requeue([job_id]) == []:
            return self.job_get(job_id)
        job = self.job_get(job_id)
        if job is not None:
            self._notify([job.queue])
        return job

    def _notify(self, queues: Sequence[str]) -> None:
        self._fetch("notify_queues", {"channel": self.channel(), "queues": list(queues)})

    def dead_letter_requeue(self, job_ids: Sequence[int] | None) -> list[int]:
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

    def worker_register(self, worker: WorkerInfo) -> None:
        self._fetch("worker_register", self._worker_params(worker))

    def worker_heartbeat(self, worker: WorkerInfo) -> None:
        with self._cursor() as cursor:
            cursor.execute(QUERIES["worker_heartbeat"], {"id": worker.id})
            if cursor.rowcount == 0:
                # Pruned while we were paused: come back. Our old claims were
                # (or will be) rescued and our fenced writes will be refused.
                cursor.execute(QUERIES["worker_register"], self._worker_params(worker))

    def worker_deregister(self, worker_id: str) -> None:
        self._fetch("worker_deregister", {"id": worker_id})

    def worker_prune_stale(self, *, older_than: float) -> int:
        with self._cursor() as cursor:
            cursor.execute(QUERIES["worker_prune_stale"], {"older_than": older_than})
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
            )
            for row in self._fetch("worker_list")
        ]

    # -- leadership -----------------------------------------------------------

    def leader_try_acquire(self, *, name: str, worker_id: str, ttl: float) -> bool:
        return bool(
            self._fetch("leader_try_acquire", {"name": name, "worker_id": worker_id, "ttl": ttl})
        )

    def leader_resign(self, *, name: str, worker_id: str) -> None:
        self._fetch("leader_resign", {"name": name, "worker_id": worker_id})

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
        """LISTEN on the queue channel until ``stop``; see the Backend Protocol.

        A canary guards the connection: every ``CANARY_INTERVAL`` seconds the
        listener NOTIFYs its own token from a second connection and expects
        the echo within ``CANARY_TIMEOUT``. No echo means the LISTEN
        connection is silently dead (a half-open socket, a proxy that dropped
        it): it is replaced. If echoes never arrive even on fresh connections
        (PgBouncer in transaction pooling mode, where LISTEN is not
        supported), the listener says so once and stops; workers then find
        jobs by polling every ``poll_interval``.
        """
        sender = _SingleConnection(self._conninfo)
        delay = 0.1
        silent_connections = 0
        try:
            while not stop.is_set():
                try:
                    # Inside the loop: even naming the channel takes a query,
                    # and a refused connection here must not end the thread.
                    echoed = self._listen_once(self.channel(), sender, on_queue, on_due, stop)
                except Exception as exc:
                    if isinstance(exc, psycopg.Error | DatabaseError):
                        reason = _describe(exc) if isinstance(exc, psycopg.Error) else str(exc)
                        logger.warning("LISTEN connection lost (%s); reconnecting", reason)
                    else:
                        # Wake-ups are an optimisation; polling covers for
                        # them, but a listener that gives up for good would not.
                        logger.exception("LISTEN failed unexpectedly; restarting it")
                    stop.wait(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if echoed:
                    silent_connections = 0
                    delay = 0.1
                    continue
                silent_connections += 1
                if silent_connections >= CANARY_GIVE_UP:
                    logger.warning(
                        "LISTEN/NOTIFY is not delivering on %s (a pooler in transaction "
                        "mode?): wake-ups off, workers poll every poll_interval",
                        self.url.redacted(),
                    )
                    return
                logger.warning("LISTEN canary got no echo; reconnecting the listener")
        finally:
            sender.close()

    def _listen_once(
        self,
        channel: str,
        sender: _SingleConnection,
        on_queue: Callable[[str], None],
        on_due: Callable[[str, float], None] | None,
        stop: threading.Event,
    ) -> bool:
        """One LISTEN connection's life. Returns whether any canary echoed
        before the connection was given up (``False``: it never delivered).
        """
        token = f"{CANARY_PREFIX}{secrets.token_hex(6)}"
        echoed = False
        with psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        ) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            # Anything enqueued while we were not listening is found by a
            # claim now rather than by the next poll.
            on_queue("*")
            sent_at: float | None = None
            # The first canary goes out at once, so a LISTEN that cannot work
            # is found within seconds of start.
            next_canary = time.monotonic()
            while not stop.is_set():
                for notify in conn.notifies(timeout=0.25):
                    if notify.payload == token:
                        echoed, sent_at = True, None
                    elif not notify.payload.startswith(CANARY_PREFIX):
                        self._dispatch(notify.payload, on_queue, on_due)
                now = time.monotonic()
                if sent_at is not None and now - sent_at > CANARY_TIMEOUT:
                    return echoed
                if sent_at is None and now >= next_canary:
                    with sender.connection() as send:
                        send.execute(
                            QUERIES["notify_queues"], {"channel": channel, "queues": [token]}
                        )
                    sent_at, next_canary = now, now + CANARY_INTERVAL
        return True

    @staticmethod
    def _dispatch(
        payload: str,
        on_queue: Callable[[str], None],
        on_due: Callable[[str, float], None] | None,
    ) -> None:
        """``queue``: jobs became available (the insert trigger, the stager);
        ``queue seconds``: a delayed job comes due then (``notify_due``).
        Queue names have no spaces.
        """
        queue, _, due_in = payload.partition(" ")
        if not due_in:
            on_queue(queue)
            return
        try:
            seconds = float(due_in)
        except ValueError:
            logger.warning("ignoring a malformed NOTIFY payload: %r", payload)
            return
        if on_due is not None:
            on_due(queue, seconds)

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
        rows = self._fetch("periodic_enqueue_tick", params)
        return int(rows[0]["id"]) if rows else None

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
