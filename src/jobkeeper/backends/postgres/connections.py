"""PostgreSQL connections (internal): one connection for a worker thread, a
pool for API calls, retry of what the server asks to retry, and the
translation of driver errors into jobkeeper's.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.abc import AdaptContext
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from jobkeeper.backends.postgres.prepared import prepare_if_direct, stale_plan
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.rows import aware_utc, job_from_row, load_json
from jobkeeper.config import DatabaseURL
from jobkeeper.errors import (
    DatabaseError,
    DatabaseUnavailable,
    DataRejected,
    UniqueKeyConflict,
)
from jobkeeper.models import Job

logger = logging.getLogger("jobkeeper.postgres")
# The pool logs every failed reconnect during an outage. An application that
# configured logging still gets those records (they propagate to its
# handlers); one that did not would get them dumped raw on stderr by
# logging's last-resort handler, beside the DatabaseUnavailable it catches.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

#: Seconds an API call waits for a pooled connection (or a connection to be
#: made) before raising DatabaseUnavailable.
POOL_TIMEOUT = 10.0
#: Seconds between probes of the server while waiting for a pooled connection.
POOL_SLICE = 0.5
CONNECT_TIMEOUT = 5
#: What every connection of ours is opened with (the worker's own, the sync
#: and async pools'): no prepared statements until prepare_if_direct has
#: seen where the connection leads.
CONNECTION_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": CONNECT_TIMEOUT,
    "prepare_threshold": None,
}
#: Seconds a pooled connection may sit idle before it is pinged on checkout.
IDLE_CHECK_AFTER = 1.0
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


def _rows(cursor: psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    # Column names straight from the result: cursor.description builds a
    # Column object per column on every call, which showed in claim profiles.
    result = cursor.pgresult
    if result is None or result.nfields == 0:
        return []
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _has_unread_input(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
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


def _reused_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """The one tuple-row cursor of a connection of ours, made on first use
    (a new cursor per call cost about 7 us of CPU, a few percent of an
    enqueue). It holds the last result until the next statement. Kept on
    the connection, not in a map keyed by it, which the cursor's own
    reference would keep alive for good.
    """
    cursor: psycopg.Cursor[Any] | None = getattr(conn, "_jobkeeper_cursor", None)
    if cursor is None or cursor.closed:
        cursor = conn.cursor(row_factory=tuple_row)
        conn._jobkeeper_cursor = cursor  # type: ignore[attr-defined]
    return cursor


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
    cause = exc.__cause__
    return isinstance(cause, _RETRY_ASKED) or (cause is not None and stale_plan(cause))


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


def configure_connection(conn: psycopg.Connection[Any]) -> None:
    """What every new connection of ours gets: safe JSON loading and, on a
    direct session, prepared statements.
    """
    load_json_safely(conn)
    prepare_if_direct(conn)


def load_json_safely(context: AdaptContext) -> None:
    """json/jsonb values read through ``context`` (a connection of ours, or
    a cursor on a caller's connection, whose own settings we leave alone)
    decode with :func:`~jobkeeper.backends.rows.load_json`, so a stored value
    Python cannot load (a row written by hand) reaches the row decoder as
    text instead of failing the fetch.
    """
    set_json_loads(load_json, context)


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
            self._conn = psycopg.connect(self._conninfo, **CONNECTION_OPTIONS)
            configure_connection(self._conn)
        try:
            yield self._conn
        except _RETRY_ASKED:
            raise  # the transaction failed, not the session
        except _LOST_SESSION:
            self._drop()
            raise
        except psycopg.errors.FeatureNotSupported as exc:
            if stale_plan(exc):
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
            kwargs=dict(CONNECTION_OPTIONS),
            timeout=POOL_TIMEOUT,
            open=False,
            name="jobkeeper",
            configure=configure_connection,
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
            # Not ``with conn``: in autocommit its commit has nothing to do
            # (transactions are ``conn.transaction()`` blocks, which end
            # themselves), and it cost a lock and a wait per call.
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
        except psycopg.errors.FeatureNotSupported as exc:
            if stale_plan(exc):
                # The schema changed under every session of the pool:
                # replace them all, not one per failed call.
                conn.close()
                self._pool.drain()
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


class PostgresConnections:
    """Where a PostgreSQL backend's statements run: its connection source,
    with driver errors translated (the base of every part of the backend).

    Args:
        url: the parsed ``postgresql://`` URL.
        dedicated: use one private connection instead of a pool.
        pool_size: most pooled connections for API calls.
    """

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
        # The async producer API (aio.py): one pool per event loop.
        self._pool_size = pool_size
        self._async_pools: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._async_checked: weakref.WeakSet[Any] = weakref.WeakSet()

    def _pool_kwargs(self) -> dict[str, Any]:
        """What every connection of ours is opened with."""
        return dict(CONNECTION_OPTIONS)

    if TYPE_CHECKING:  # the backend's async mixin (aio.py) supplies it

        def _close_async_pools(self) -> None: ...

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
        except psycopg.errors.FeatureNotSupported as exc:
            if stale_plan(exc):
                # A migration changed what a prepared statement returns; its
                # connection was given up, and the next one prepares afresh
                # (callers that own the transaction run it again).
                raise DatabaseError(
                    f"PostgreSQL refused a statement prepared before a schema change "
                    f"({_describe(exc)}); running it again may succeed"
                ) from exc
            raise DatabaseError(f"PostgreSQL error: {_describe(exc)}") from exc
        except psycopg.Error as exc:
            raise DatabaseError(f"PostgreSQL error: {_describe(exc)}") from exc

    @contextlib.contextmanager
    def _cursor(self, *, transaction: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        checked_out = False
        try:
            with self._errors(), self._source.connection() as conn:
                checked_out = True
                cursor = _reused_cursor(conn)
                if transaction:
                    with conn.transaction():
                        yield cursor
                else:
                    yield cursor
        except DatabaseUnavailable as exc:
            if not (checked_out and isinstance(exc.__cause__, psycopg.OperationalError)):
                raise
            # Lost with a statement in flight: unlike a failed connect, its
            # commit may have landed, and a caller that simply runs it again
            # can write it twice.
            raise DatabaseUnavailable(
                f"{exc} (the connection was lost during the call: what it was writing may "
                "have committed; check before running it again)"
            ) from exc.__cause__

    def _fetch(
        self, name: str, params: dict[str, Any] | None = None, *, binary: bool = False
    ) -> list[dict[str, Any]]:
        with self._cursor() as cursor:
            cursor.execute(QUERIES[name], params or {}, binary=binary)
            return _rows(cursor)

    def _now_param(self, now: datetime | None) -> datetime | None:
        return now

    def _jobs(self, rows: list[dict[str, Any]], *, dead: bool = False) -> list[Job]:
        return [job_from_row(row, aware_utc, dead=dead, json_decoded=True) for row in rows]

    def channel(self) -> str:
        """The NOTIFY channel: ``jobkeeper_<schema>``, or ``jobkeeper_<md5 of
        the schema>`` when that would pass the 63-byte identifier limit (the
        same rule as the insert trigger's).
        """
        if self._channel is None:
            self._channel = f"jobkeeper_{self._schema_key(53)}"
        return self._channel

    def done_channel(self) -> str:
        """The channel of awaited jobs' ends (``wait``'s listener listens on it):
        ``jobkeeper_done_<schema>``, or the schema's md5 past 48 bytes.
        """
        return f"jobkeeper_done_{self._schema_key(48)}"

    def _schema_key(self, longest: int) -> str:
        """The current schema's name, or its md5 when longer than ``longest`` bytes."""
        schema: str | None = getattr(self, "_schema", None)
        if schema is None:
            rows = self._fetch_raw(QUERIES["notify_channel"])
            schema = rows[0][0] if rows else None
            if schema is None:
                raise DatabaseError(
                    "PostgreSQL has no current schema (check search_path in the URL)"
                )
            self._schema: str = schema
        if len(schema.encode()) > longest:
            return hashlib.md5(schema.encode()).hexdigest()
        return schema

    def _fetch_raw(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        with self._cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def close(self) -> None:
        self._source.close()
        self._close_async_pools()
