"""Where a PostgreSQL backend's connections come from (internal): a pool
for API calls that checks connections on checkout, and what every connection
of ours is opened and configured with (``single.py`` has a worker thread's
one connection). ``connections.py`` runs statements on them.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg.abc import AdaptContext
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from jobkeeper.backends import forks
from jobkeeper.backends.postgres import pool_exit, stuck
from jobkeeper.backends.postgres.pool_logs import close_on_purpose
from jobkeeper.backends.postgres.pool_setup import (
    SetupFailures,
    busy_pool_message,
    configured,
    probe,
)
from jobkeeper.backends.postgres.prepared import stale_plan
from jobkeeper.backends.postgres.session_setup import set_up
from jobkeeper.backends.rows import load_json

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
#: and async pools'): no prepared statements until session_setup.set_up has
#: seen where the connection leads; UTF-8 whatever the database's encoding,
#: because stored JSON is read back as UTF-8 (in a LATIN1 database the
#: session spoke LATIN1, and "é" came back as U+FFFD); the server converts,
#: and refuses a character its encoding lacks.
CONNECTION_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": CONNECT_TIMEOUT,
    "prepare_threshold": None,
    "client_encoding": "UTF8",
}
#: Seconds a pooled connection may sit idle before it is pinged on checkout.
IDLE_CHECK_AFTER = 1.0
#: Seconds the pre-use ping may go unanswered before the stuck-call
#: watchdog checks on it: it asks nothing of the server, so one that does
#: not answer it promptly is not working on it (an API call waited 141.8 s in
#: it behind a proxy that had stopped forwarding).
PING_STUCK_AFTER = 2.0
#: What jobkeeper asks of libpq unless the URL (or ``PGTARGETSESSIONATTRS``)
#: says otherwise: a session that can write. A demoted primary, a standby, a
#: server with ``default_transaction_read_only`` is refused at connect (and,
#: with several hosts in the URL, the writable one is found), instead of
#: failing every write of a session that looks healthy.
TARGET_SESSION_ATTRS = "read-write"
#: TCP settings every connection of ours asks libpq for, unless the URL sets
#: its own: a peer that stops answering at the network level (a failed-over
#: host whose address vanished, a NAT or firewall that dropped the flow) is
#: found within about half a minute. Without them a worker waited on such a
#: connection for 15 min 39 s (the kernel's retransmissions, tcp_retries2=15)
#: with every thread parked and nothing logged, and an idle connection for
#: the system's two hours of keepalive. Kernel-level: a busy or blocked
#: server still acknowledges, so no query is cut short by these. Unix
#: sockets ignore them.
TCP_DEFAULTS: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "15",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    # Milliseconds sent data may stay unacknowledged (Linux TCP_USER_TIMEOUT;
    # it also ends keepalive probing sooner).
    "tcp_user_timeout": "20000",
}
#: What our sessions are called in ``pg_stat_activity``: the API's pools this,
#: a worker's own connections "jobkeeper <role> <worker id>" (see
#: :meth:`~jobkeeper.backends.base.Backend.dedicated`).
APPLICATION_NAME = "jobkeeper"
#: PostgreSQL keeps this many bytes of a session's name (NAMEDATALEN - 1).
SESSION_NAME_BYTES = 63


def session_name(role: str) -> str:
    """``"jobkeeper <role>"``, within ``SESSION_NAME_BYTES``: a longer one
    loses its middle (marked ``~``), not its end, where a worker id's pid
    and random part tell workers on one host apart (a cloud host name alone
    can pass 40 bytes).
    """
    name = f"{APPLICATION_NAME} {role}" if role else APPLICATION_NAME
    raw = name.encode()
    if len(raw) <= SESSION_NAME_BYTES:
        return name
    head, tail = raw[:40], raw[-(SESSION_NAME_BYTES - 41) :]
    return f"{head.decode(errors='ignore')}~{tail.decode(errors='ignore')}"


def has_unread_input(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server sent anything to this idle connection (without reading it)."""
    try:
        fd = conn.fileno()
        if not hasattr(select, "poll"):  # Windows
            return bool(select.select([fd], [], [fd], 0)[0])
        # One poll object per connection, kept on it (a connection's socket
        # is its own for life): making and registering one on every checkout
        # cost as much as the poll.
        poller: Any = getattr(conn, "_jobkeeper_poller", None)
        if poller is None or poller[0] != fd:
            poller = (fd, select.poll())
            poller[1].register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
            conn._jobkeeper_poller = poller  # type: ignore[union-attr]
        return bool(poller[1].poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True  # no usable socket: let the ping decide


def pool_repair(error: BaseException | None) -> tuple[bool, bool]:
    """What a call's ``error`` (None: it succeeded) asks of the pool, sync or
    async, that lent its connection: ``(suspect, replace_all)``: probe the
    server before the next checkout; close this session and replace every
    other one too.
    """
    if error is None or isinstance(error, RETRY_ASKED):
        return False, False  # a lost race, not the server's health
    if isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
        # Every session of the pool was opened to the server that now refuses
        # writes: kept, each would fail every later call, writable or not.
        # The probe on the next checkout reports read-only at once.
        return True, True
    if isinstance(error, psycopg.OperationalError):
        return True, False
    if isinstance(error, psycopg.errors.FeatureNotSupported) and stale_plan(error):
        # The schema changed under every session of the pool.
        return False, True
    return False, False


def transaction_blocks_unbalanced(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
) -> bool:
    """Whether psycopg's count of the ``conn.transaction()`` blocks open on
    ``conn`` is off, which every later block on it would fail on.

    psycopg 3.3's ``Transaction.__enter__`` undoes an interrupted entry by
    leaving the block whether or not it was counted in: a Ctrl-C that lands
    as the entry's wait begins, before the block is counted, takes the count
    to -1. The server is idle, so the pool keeps the connection, and every
    later ``conn.transaction()`` on it failed ("transaction rollback at the
    wrong nesting level"): a Ctrl-C storm on a bulk enqueue left thousands
    of failed calls behind it. The count is psycopg's private
    ``_num_transactions``, which no public API exposes; without it (another
    psycopg) a connection is taken as sound.
    """
    return getattr(conn, "_num_transactions", 0) != 0


def reused_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
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


def with_session_defaults(conninfo: str, application_name: str = APPLICATION_NAME) -> str:
    """``conninfo`` asking for a writable session, unless the user chose, and
    naming it ``application_name`` unless the URL, ``PGAPPNAME`` or a ``-c
    application_name=`` in ``options`` or ``PGOPTIONS`` names it (libpq's
    ``fallback_application_name`` gives way to the first two; with the last
    two none is sent), with :data:`TCP_DEFAULTS` where the URL names none.
    """
    given = conninfo_to_dict(conninfo)
    defaults: dict[str, str] = {k: v for k, v in TCP_DEFAULTS.items() if k not in given}
    if "PGTARGETSESSIONATTRS" not in os.environ and "target_session_attrs" not in given:
        defaults["target_session_attrs"] = TARGET_SESSION_ATTRS
    # A name set with "-c application_name=..." (the URL's options, or
    # PGOPTIONS) would lose to the one the connection itself sends.
    options = f"{given.get('options', '')} {os.environ.get('PGOPTIONS', '')}"
    if "fallback_application_name" not in given and "application_name" not in options:
        defaults["fallback_application_name"] = application_name
    if not defaults:
        return conninfo
    # libpq takes a URL ending in "?" or "&", but not one with "?&" in it.
    separator = "" if conninfo.endswith(("?", "&")) else "&" if "?" in conninfo else "?"
    return f"{conninfo}{separator}{urlencode(defaults, quote_via=quote)}"


#: Errors after which a session is given up. A read-only session stays so for
#: its whole life (PostgreSQL reads default_transaction_read_only at session
#: start; a server in recovery stays in it): retrying on it wedged workers
#: after a failover even once the address led to a writable server again.
LOST_SESSION = (
    psycopg.OperationalError,
    psycopg.errors.ReadOnlySqlTransaction,
    # The server rolled back a transaction left idle, and closed the session.
    psycopg.errors.IdleInTransactionSessionTimeout,
)
#: What PostgreSQL aborts a transaction with, asking for it to be run again.
RETRY_ASKED = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def configure_connection(conn: psycopg.Connection[Any]) -> None:
    """What every new connection of ours gets: safe JSON loading, and what
    :func:`~jobkeeper.backends.postgres.session_setup.set_up` gives it.
    """
    forks.note(conn)
    load_json_safely(conn)
    set_up(conn)


def load_json_safely(context: AdaptContext) -> None:
    """json/jsonb values read through ``context`` (a connection of ours, or
    a cursor on a caller's connection, whose own settings we leave alone)
    decode with :func:`~jobkeeper.backends.rows.load_json`, so a stored value
    Python cannot load (a row written by hand) reaches the row decoder as
    text instead of failing the fetch.
    """
    set_json_loads(load_json, context)


class PooledConnections:
    """A psycopg_pool pool, opened on first use, checking connections on
    checkout so a restarted server costs no failed API call.
    """

    def __init__(self, conninfo: str, max_size: int) -> None:
        self._conninfo = conninfo
        self._max_size = max_size
        #: New sessions whose set-up failed in a row (see pool_setup).
        self._setup = SetupFailures()
        self._pool = self._new_pool()
        self._opened = False
        #: Set by close(): the pool is not opened after it (one opened by a
        #: call racing the close was left open until the collector came).
        self._closed = False
        #: Set after a failure that may mean the server is gone: the next
        #: checkout probes with a direct connection first.
        self._suspect = False
        self._lock = threading.Lock()
        #: A pooled call may wait on the server (a lock) as long as an API
        #: call waits for a connection before the watchdog checks on it.
        self._watch = stuck.Watch(f"{APPLICATION_NAME} (API pool)", POOL_TIMEOUT, conninfo)
        self._ping_watch = stuck.Watch(
            f"{APPLICATION_NAME} (API pool, pre-use ping)", PING_STUCK_AFTER, conninfo
        )
        forks.watch(self)

    def drop_inherited(self) -> None:
        """In a forked child: a new pool, opened on first use (``forks``).
        The parent's is kept, never closed here: its threads are not in the
        child, and a close would wait on them and on locks they may hold.
        """
        forks.keep(self._pool)
        self._lock = threading.Lock()
        self._pool = self._new_pool()
        self._opened = False

    def _new_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        return ConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=self._max_size,
            kwargs=dict(CONNECTION_OPTIONS),
            timeout=POOL_TIMEOUT,
            open=False,
            name="jobkeeper",
            configure=configured(configure_connection, self._setup),
        )

    def _replace_pool(self, pool: ConnectionPool[psycopg.Connection[Any]]) -> None:
        """Put a new pool in place of ``pool``, whose wait for a connection
        was interrupted, and close ``pool`` in the background.

        psycopg_pool's sync ``getconn`` (3.3.3 and before) handles only
        ``Exception`` while it waits: after a KeyboardInterrupt its waiting
        client stays queued, and the next connection given back or opened
        is handed to it and never seen again. With ``pool_size=1`` one
        Ctrl-C at the wrong moment made every later call wait out
        ``POOL_TIMEOUT``. The queue is the pool's own; only a new pool is
        free of it. Connections still out go back to the old pool, which
        closes them once it is closed.
        """
        with self._lock:
            if self._pool is not pool or self._closed:
                return
            replacement = self._new_pool()
            # Open before it is seen: other threads' calls go on through it
            # (a call waiting on the old pool when it closes tries again
            # here, see _getconn).
            replacement.open(wait=False)
            self._pool = replacement
        # Not on the interrupted caller's thread: close() waits for the
        # pool's own threads to end.
        threading.Thread(target=pool.close, name="jobkeeper-pool-close", daemon=True).start()

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
        returned_at: float = getattr(conn, "_jobkeeper_returned_at", 0.0)
        idle = time.monotonic() - returned_at > IDLE_CHECK_AFTER
        if not idle and not has_unread_input(conn):
            return True
        stuck.enter(id(conn), conn, self._ping_watch)
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error:
            if stuck.cut_reason(conn) is not None:
                # Cut unanswered: the pool's other sessions, opened alike,
                # likely lead to the same silence; new ones are opened.
                conn._jobkeeper_pool.drain()  # type: ignore[attr-defined]
            return False
        finally:
            stuck.leave(id(conn))
        return True

    def _probe(self) -> None:
        """Connect directly once: raises at once (libpq's own reason) when
        the server is unreachable, instead of letting the caller wait out
        the pool's timeout while it retries in the background (see pool_setup).
        """
        probe(self._conninfo, CONNECTION_OPTIONS, configure_connection, self._setup)
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
            pool = self._pool
            try:
                conn = pool.getconn(timeout=max(min(POOL_SLICE, remaining), 0.001))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    why = busy_pool_message(POOL_TIMEOUT, pool, self._setup)
                    raise PoolTimeout(why) from None
                # Busy, or the server went away: a probe tells which.
                self._suspect = True
                continue
            except PoolClosed:
                if self._closed:
                    raise
                if self._pool is not pool:
                    continue  # replaced after a Ctrl-C in another call, or released
                if not self._opened:
                    self._open()  # released at exit, then used again
                    continue
                raise
            except BaseException as exc:
                if not isinstance(exc, Exception):  # Ctrl-C (see _replace_pool)
                    self._replace_pool(pool)
                raise
            # Until it is returned, an error here (a Ctrl-C during the check
            # included) must give it back, or the pool never sees it again.
            try:
                conn._jobkeeper_pool = pool  # type: ignore[attr-defined]
                if self._alive(conn):
                    stuck.enter(id(conn), conn, self._watch)  # left in checkin
                    return conn
                # Cut: the server may be gone; the probe says so at once if it is.
                self._suspect = True
                close_on_purpose(conn)
            except BaseException:
                pool.putconn(conn)
                raise
            pool.putconn(conn)
            if time.monotonic() >= deadline:
                raise PoolTimeout(f"no live connection within {POOL_TIMEOUT:g}s")

    def connection(self) -> PooledCheckout:
        """A context manager: a live pooled connection, given back on exit."""
        return PooledCheckout(self)

    def checkout(self) -> psycopg.Connection[Any]:
        """A live pooled connection (opening the pool on first use); give it
        back with :meth:`checkin`.
        """
        if not self._opened:
            self._open()
        return self._getconn()

    def _open(self) -> None:
        with self._lock:
            if self._closed:
                raise PoolClosed(f"the pool {self._pool.name!r} is already closed")
            if not self._opened:
                self._probe()
                self._pool.open(wait=False)
                self._opened = True
                pool_exit.watch(self)

    def checkin(self, conn: psycopg.Connection[Any], error: BaseException | None) -> None:
        """Give back ``conn``, used without a transaction of its own
        (``with conn`` would commit nothing in autocommit, and cost a lock and
        a wait per call), after ``error`` (None: the call succeeded).
        """
        # The pool it came from: a Ctrl-C may have replaced the pool since.
        pool: ConnectionPool[psycopg.Connection[Any]] = conn._jobkeeper_pool  # type: ignore[attr-defined]
        stuck.leave(id(conn))
        try:
            # Noted here, not in a pool ``reset`` callback: with one, the
            # pool hands every returned connection to a worker thread,
            # which cost ~150 us of CPU and latency per API call. Not in the
            # ``finally``: a Ctrl-C in the clock read there skipped putconn.
            conn._jobkeeper_returned_at = time.monotonic()  # type: ignore[attr-defined]
            suspect, replace_all = pool_repair(error)
            self._suspect = self._suspect or suspect
            if replace_all:
                close_on_purpose(conn)
                pool.drain()
            elif error is not None and transaction_blocks_unbalanced(conn):
                close_on_purpose(conn)  # the pool opens a replacement
        finally:
            pool.putconn(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, False
        pool_exit.forget(self)
        if opened:
            self._pool.close()

    def release(self) -> None:
        """Close the pool, as :meth:`close`, but open a new one if used
        again (as a ``JobQueue`` reconnects after ``close()``); ``pool_exit``
        calls it at interpreter exit.
        """
        with self._lock:
            if self._closed or not self._opened:
                return
            pool, self._pool = self._pool, self._new_pool()
            self._opened = False
        pool_exit.forget(self)
        pool.close()


class PooledCheckout:
    """``with source.connection() as conn``: :meth:`PooledConnections.checkout`
    on entry, :meth:`~PooledConnections.checkin` on exit. A class, not a
    generator: every API call goes through one, and a generator context
    manager's set-up cost a tenth of an enqueue's Python.
    """

    __slots__ = ("_conn", "_source")

    def __init__(self, source: PooledConnections) -> None:
        self._source = source
        self._conn: psycopg.Connection[Any] | None = None

    def __enter__(self) -> psycopg.Connection[Any]:
        self._conn = self._source.checkout()
        return self._conn

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._source.checkin(conn, error)
