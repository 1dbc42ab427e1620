"""PostgreSQL statements' plumbing (internal): running them on a connection
from the backend's source (``sources.py``), retry of what the server asks to
retry, and the translation of driver errors into jobkeeper's.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

from jobkeeper.backends import forks
from jobkeeper.backends.migrate import MissingSchemaError
from jobkeeper.backends.postgres import stuck
from jobkeeper.backends.postgres.prepared import stale_plan
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.postgres.refusals import refusal
from jobkeeper.backends.postgres.session_setup import misplaced_tables, no_current_schema
from jobkeeper.backends.postgres.single import SingleConnection
from jobkeeper.backends.postgres.sources import (
    APPLICATION_NAME,
    CONNECTION_OPTIONS,
    RETRY_ASKED,
    PooledConnections,
    reused_cursor,
    with_session_defaults,
)
from jobkeeper.backends.rows import aware_utc, job_from_row
from jobkeeper.database_url import DatabaseURL
from jobkeeper.errors import (
    DatabaseError,
    DatabaseRefused,
    DatabaseUnavailable,
    DataRejected,
    UniqueKeyConflict,
)
from jobkeeper.models import Job

logger = logging.getLogger("jobkeeper.postgres")

P = ParamSpec("P")
T = TypeVar("T")

#: An insert of our own transaction that PostgreSQL aborts asking for a retry
#: (a deadlock, a serialization failure) is retried this many times, after a
#: jittered pause of up to ``INSERT_RETRY_PAUSE * 2**n`` seconds.
INSERT_RETRIES = 5
INSERT_RETRY_PAUSE = 0.02


def rows_of(cursor: psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    # Column names straight from the result: cursor.description builds a
    # Column object per column on every call, which showed in claim profiles.
    result = cursor.pgresult
    if result is None or result.nfields == 0:
        return []
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def retry_asked(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, RETRY_ASKED) or (cause is not None and stale_plan(cause))


def retrying(run: Callable[[], list[Job]]) -> list[Job]:
    """``run()``, run again (up to ``INSERT_RETRIES`` times, after a jittered
    pause) when PostgreSQL aborted its transaction asking for a retry. Only
    for transactions of our own: nothing of an aborted one was written.
    """
    for retry in range(INSERT_RETRIES):
        try:
            return run()
        except DatabaseError as exc:
            if not retry_asked(exc):
                raise
            logger.debug("insert aborted (%s); running it again", exc)
        time.sleep(random.uniform(0, INSERT_RETRY_PAUSE * 2**retry))
    return run()


def translated(exc: BaseException, url: DatabaseURL) -> Exception | None:
    """The error jobkeeper raises for a driver error of a statement on
    ``url``'s server (None: ``exc`` is not the driver's, and goes up as it is).
    """
    if isinstance(exc, RETRY_ASKED):
        # Not the server's health: the transaction lost a race (callers
        # that own the transaction retry it, see job_insert_many).
        return DatabaseError(
            f"PostgreSQL aborted the transaction ({describe(exc)}); running it again may succeed",
            retry_asked=True,
        )
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return DatabaseUnavailable(
            f"PostgreSQL at {url.redacted()} is read-only (a standby, a demoted "
            f"primary, or default_transaction_read_only=on): {describe(exc)}; "
            "the session was dropped and the next call reconnects"
        )
    if isinstance(exc, PoolClosed):
        # The application closed the queue (close(), aclose()) while this
        # call waited for a connection: the server is fine, and nothing of
        # the call reached it. A later call opens a pool again.
        return DatabaseUnavailable(
            f"the connection pool for {url.redacted()} was closed (JobQueue.close() or "
            "aclose()) while the call waited for a connection; nothing of it was written"
        )
    if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
        # A live server gave up on the statement; "unavailable" would send
        # people looking for an outage. Still DatabaseUnavailable: it passes
        # (a lock released, a quieter moment), so callers retry it alike.
        return DatabaseUnavailable(
            f"PostgreSQL at {url.redacted()} cancelled the statement: {describe(exc)} "
            "(statement_timeout, lock_timeout or a cancel request; nothing of it committed)",
            unreachable=False,
        )
    closed = closed_while_idle(exc)
    if closed is not None:
        return DatabaseUnavailable(
            f"PostgreSQL at {url.redacted()} closed the session: {describe(exc)} ({closed})",
            unreachable=False,
            retry_asked=True,
        )
    if isinstance(exc, psycopg.errors.InvalidSchemaName):
        return no_schema(url, describe(exc))
    if isinstance(exc, psycopg.errors.ProgramLimitExceeded):
        # An index entry or a row past PostgreSQL's limits: the data's size,
        # not the server's state (it read as "unavailable", and callers that
        # retry an outage retried it for ever).
        return DataRejected(f"PostgreSQL refused the data: {describe(exc)}")
    refused = refusal(exc)
    if refused is not None:
        # What the URL or the server's set-up refuses, not an outage: a
        # worker stops on it at start instead of waiting (see refusals.py).
        return DatabaseRefused(f"PostgreSQL at {url.redacted()} refused the connection: {refused}")
    if isinstance(exc, psycopg.Error) and insufficient_resources(exc.sqlstate):
        # Conditions that pass, not properties of the call (a full disk, no
        # memory); the server answered, so no outage either.
        return DatabaseUnavailable(
            f"PostgreSQL at {url.redacted()} could not take the call: {describe(exc)}",
            unreachable=False,
        )
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return DatabaseUnavailable(
            f"PostgreSQL at {url.redacted()} is unavailable: {describe(exc)}"
        )
    if isinstance(exc, psycopg.errors.UniqueViolation):
        if exc.diag.constraint_name == "jobkeeper_jobs_unique_idx":
            return UniqueKeyConflict(f"PostgreSQL refused the data: {describe(exc)}")
        return DataRejected(f"PostgreSQL refused the data: {describe(exc)}")
    if isinstance(exc, psycopg.DataError | psycopg.IntegrityError):
        return DataRejected(f"PostgreSQL refused the data: {describe(exc)}")
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        return DatabaseError(f"{describe(exc)} -- {url.migrate_hint()} first")
    if isinstance(exc, psycopg.errors.FeatureNotSupported) and stale_plan(exc):
        # A migration changed what a prepared statement returns; its
        # connection was given up, and the next one prepares afresh
        # (callers that own the transaction run it again).
        return DatabaseError(
            f"PostgreSQL refused a statement prepared before a schema change "
            f"({describe(exc)}); running it again may succeed"
        )
    if isinstance(exc, psycopg.Error):
        return DatabaseError(f"PostgreSQL error: {describe(exc)}")
    return None


def insufficient_resources(sqlstate: str | None) -> bool:
    """Whether ``sqlstate`` is of class 53 (a full disk, out of memory),
    but for 53300, too many connections: that one keeps us out.
    """
    return sqlstate is not None and sqlstate.startswith("53") and sqlstate != "53300"


def no_schema(url: DatabaseURL, what: str) -> MissingSchemaError:
    """The error for a search path none of whose schemas exists, where
    ``migrate`` would create nothing and every statement finds no table.
    """
    return MissingSchemaError(
        f"{what}: no schema of the search_path exists on {url.redacted()} (the URL's "
        "options=-c search_path=... names one that does not; PostgreSQL folds an unquoted "
        "name to lower case, so write Tenant3 as %22Tenant3%22): create it (CREATE SCHEMA) "
        "or fix the URL"
    )


#: What a statement meets when the search path names no schema that exists.
UNDEFINED = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)


def closed_while_idle(exc: BaseException) -> str | None:
    """What is known of a call whose session the server closed for sitting
    idle (None: ``exc`` is not that). Such a session was closed before the
    call's statement reached it (57P05, ``idle_session_timeout``: a session
    running a statement is not idle), or with its transaction rolled back
    (25P03, ``idle_in_transaction_session_timeout``): either way nothing of
    the call was written. (A call of several autocommitted statements sits
    idle between them only for its own Python's time, far below any such
    timeout.) Not so after ``pg_terminate_backend`` (57P01), which may land
    with a statement in flight.
    """
    if isinstance(exc, psycopg.errors.IdleSessionTimeout):
        return (
            "idle_session_timeout: the server had closed the idle session before the "
            "statement reached it; nothing of the call was written"
        )
    if isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout):
        return (
            "idle_in_transaction_session_timeout: the server rolled back the transaction "
            "left idle and closed the session; nothing of the call was written"
        )
    return None


def closed_before_call(exc: BaseException) -> bool:
    """Whether ``exc``, a jobkeeper error, says the server had closed the
    call's session for sitting idle (:func:`closed_while_idle`, read from the
    driver's error it was raised from): nothing of the call ran. A session
    that ended without the server's word (libpq's "server closed the
    connection unexpectedly", no SQLSTATE) is not one: a large statement or
    a pipeline that met the same close came so more often than not (the
    server's FATAL lost to the reset), as does a cut with a statement in flight.
    """
    cause = exc.__cause__
    return (
        isinstance(exc, DatabaseUnavailable)
        and cause is not None
        and closed_while_idle(cause) is not None
    )


def session_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the session itself ended (the socket closed, the
    server shut the backend down: SQLSTATE class 08 or 57P), not that a live
    server refused or cancelled the statement (a statement or lock timeout:
    nothing of it committed).
    """
    if not isinstance(exc, psycopg.OperationalError):
        return False
    sqlstate = exc.sqlstate
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


class DriverErrors:
    """Around statements: a driver error goes up as jobkeeper's (see
    :func:`translated`), caused by it. A class, not a generator: it wraps
    every statement, and a generator context manager's set-up cost more
    than most of what it wraps on the client.

    A connection lost once :attr:`checked_out` was set (not refused by the
    server) is said to be lost during the call: unlike a failed connect, a
    statement in flight may have committed, and a caller that simply runs
    it again can write it twice.
    """

    __slots__ = ("_url", "checked_out", "connection")

    def __init__(self, url: DatabaseURL) -> None:
        self._url = url
        #: Set by the caller once it holds a connection.
        self.checked_out = False
        #: The connection held, when the caller sets it: a missing table on
        #: a session pinned to its current schema is said as such.
        self.connection: Any = None

    def __enter__(self) -> DriverErrors:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if exc is None:
            return
        error = translated(exc, self._url)
        if error is None:
            return
        if isinstance(exc, UNDEFINED) and no_current_schema(self.connection):
            # Said as migrate, doctor and a worker's start say it: "run
            # migrate" would fail the same way (no schema to create tables in).
            raise no_schema(self._url, "the search path names no schema that exists") from exc
        misplaced = misplaced_tables(self.connection)
        if misplaced is not None and isinstance(exc, psycopg.errors.UndefinedTable):
            # "run migrate" alone would make a second, empty installation
            # where jobkeeper's tables are further down the search path.
            raise misplaced.error(self._url.migrate_hint()) from exc
        if (
            self.checked_out
            and isinstance(error, DatabaseUnavailable)
            and session_lost(exc)
            and closed_while_idle(exc) is None
        ):
            cut = stuck.cut_reason(self.connection)
            how = f"jobkeeper cut the connection: {cut}" if cut else "the connection was lost"
            error = DatabaseUnavailable(
                f"{error} ({how} during the call: what it was writing may "
                "have committed; check before running it again)"
            )
        raise error from exc


class PostgresConnections:
    """Where a PostgreSQL backend's statements run: its connection source,
    with driver errors translated (the base of every part of the backend).

    Args:
        url: the parsed ``postgresql://`` URL.
        dedicated: use one private connection instead of a pool.
        pool_size: most pooled connections for API calls.
        application_name: what its sessions are called in ``pg_stat_activity``
            unless the user names them (see ``with_session_defaults``).
        stuck_after: seconds a call on the dedicated connection may go
            without an answer before the stuck-call watchdog looks at it.
        stopping: set when the dedicated connection's owner begins to stop
            (see ``stuck.Watch``).
    """

    def __init__(
        self,
        url: DatabaseURL,
        *,
        dedicated: bool = False,
        pool_size: int = 10,
        application_name: str = APPLICATION_NAME,
        stuck_after: float = stuck.STUCK_AFTER,
        stopping: threading.Event | None = None,
    ) -> None:
        self.url = url
        self._conninfo = with_session_defaults(
            url.url.replace("postgres://", "postgresql://", 1), application_name
        )
        self._source: SingleConnection | PooledConnections = (
            SingleConnection(
                self._conninfo, application_name, stuck_after=stuck_after, stopping=stopping
            )
            if dedicated
            else PooledConnections(self._conninfo, pool_size)
        )
        # Only the API's pool runs a call closed while idle again itself
        # (see _once_more): a worker's loops rerun their own steps.
        self._reruns = not dedicated
        self._channel: str | None = None
        self._warned_autovacuum_off = False
        # Caller connections already checked (weak: closing them forgets them).
        self._checked_connections: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        # The async producer API (aio.py): one pool per event loop.
        self._pool_size = pool_size
        self._async_pools: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._async_checked: weakref.WeakSet[Any] = weakref.WeakSet()
        forks.watch(self)

    def drop_inherited(self) -> None:
        """In a forked child: the event loops' pools are the parent's (a
        loop that forked from a coroutine goes on running in the child, its
        pool and spare connection with it); each loop opens a new one. The
        source (pool or single connection) drops its own.
        """
        forks.keep(self._async_pools)
        self._async_pools = weakref.WeakKeyDictionary()

    def _pool_kwargs(self) -> dict[str, Any]:
        """What every connection of ours is opened with."""
        return dict(CONNECTION_OPTIONS)

    if TYPE_CHECKING:  # the backend's async mixin (aio.py) supplies it

        def _close_async_pools(self) -> None: ...

    # -- plumbing -----------------------------------------------------------

    def _errors(self) -> DriverErrors:
        """Translate driver errors into jobkeeper's, naming the server."""
        return DriverErrors(self.url)

    @contextlib.contextmanager
    def _cursor(self, *, transaction: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        with self._errors() as call, self._source.connection() as conn:
            call.checked_out = True
            call.connection = conn
            cursor = reused_cursor(conn)
            if transaction:
                with conn.transaction():
                    yield cursor
            else:
                yield cursor

    def _once_more(self, run: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``run(*args, **kwargs)``, run once more when the server had closed
        its pooled session for sitting idle before the call reached it
        (:func:`closed_before_call`; DEBUG). The pool's pre-use check and the
        server's close can pass each other: under ``idle_session_timeout =
        '300ms'`` 2 calls in about 800 failed so. The failed session is gone,
        and the next checkout probes the server and checks the connection it
        takes. ``run`` takes a connection of its own and is one statement, one
        transaction of ours or reads: an autocommitted write before the
        statement that met the close would run twice. Never a call on the caller's
        connection (its transaction is the caller's to retry).
        """
        try:
            return run(*args, **kwargs)
        except DatabaseUnavailable as exc:
            if not (self._reruns and closed_before_call(exc)):
                raise
            logger.debug("%s; running the call once more on another session", exc)
        return run(*args, **kwargs)

    def _fetch(
        self, name: str, params: dict[str, Any] | None = None, *, binary: bool = False
    ) -> list[dict[str, Any]]:
        return self._once_more(self._fetch_once, name, params, binary)

    def _fetch_once(
        self, name: str, params: dict[str, Any] | None, binary: bool
    ) -> list[dict[str, Any]]:
        with self._cursor() as cursor:
            cursor.execute(QUERIES[name], params or {}, binary=binary)
            return rows_of(cursor)

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
            schema = self._remember_schema(rows[0][0] if rows else None)
        if len(schema.encode()) > longest:
            return hashlib.md5(schema.encode()).hexdigest()
        return schema

    def _remember_schema(self, schema: str | None) -> str:
        """Keep ``schema`` (what ``notify_channel`` read) for the channels."""
        if schema is None:
            raise no_schema(self.url, "the search path names no schema that exists")
        self._schema: str = schema
        return schema

    def _fetch_raw(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        return self._once_more(self._fetch_raw_once, query, params)

    def _fetch_raw_once(
        self, query: str, params: Sequence[Any] | Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        with self._cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def _rolled_back(self, query: str) -> None:
        """Run ``query`` in a transaction of its own, then roll it back."""
        with self._cursor(transaction=True) as cursor:
            cursor.execute(query)
            raise psycopg.Rollback()

    def connection_lock_wait(self, *, seconds: float | None) -> None:
        """Nothing: a pooled connection is no thread's (see the Protocol)."""

    def _release_thread(self) -> None:
        """Nothing to let go of: connections go back to the pool after each call."""

    def close(self) -> None:
        self._source.close()
        self._close_async_pools()
