"""One lazily reopened PostgreSQL connection for one worker thread
(internal): what a dedicated backend's statements run on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from jobkeeper.backends import forks
from jobkeeper.backends.postgres import stuck
from jobkeeper.backends.postgres.prepared import stale_plan
from jobkeeper.backends.postgres.sources import (
    APPLICATION_NAME,
    CONNECTION_OPTIONS,
    LOST_SESSION,
    RETRY_ASKED,
    configure_connection,
    has_unread_input,
    transaction_blocks_unbalanced,
)

logger = logging.getLogger("jobkeeper.postgres")


class SingleConnection:
    """One lazily (re)opened connection for one worker thread.

    After a connection error the connection is dropped and the next use
    reconnects, so a worker survives a database restart or
    ``pg_terminate_backend`` by retrying its loop. A connection the server
    closed while it sat idle is replaced before use (see :meth:`_check_idle`).

    Args:
        conninfo: libpq connection string.
        name: what log lines call the connection (its session's name).
        stuck_after: seconds a call may go without an answer before the
            stuck-call watchdog looks at it (see :mod:`.stuck`).
        stopping: set when the owner begins to stop: its calls are then
            looked at sooner (``stuck.STOP_STUCK_AFTER``).
    """

    def __init__(
        self,
        conninfo: str,
        name: str = APPLICATION_NAME,
        *,
        stuck_after: float = stuck.STUCK_AFTER,
        stopping: threading.Event | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._name = name
        self._watch = stuck.Watch(name, stuck_after, conninfo, stopping)
        self._key = id(self)
        self._conn: psycopg.Connection[Any] | None = None
        #: Whether a connection closed while idle was logged at INFO yet:
        #: later ones go to DEBUG (idle_session_timeout closes one per pass).
        self._said_closed_idle = False
        forks.watch(self)

    def drop_inherited(self) -> None:
        """In a forked child: forget the parent's connection (``forks``
        made it unusable without a word to the server); the next use opens
        the child's own.
        """
        forks.keep(self._conn)
        self._conn = None

    def _check_idle(self, conn: psycopg.Connection[Any]) -> None:
        """Ping ``conn`` when the server sent it anything while it sat idle,
        and drop it if the ping fails, so the next use reconnects.

        A server that ends an idle session (``idle_session_timeout``,
        ``pg_terminate_backend``, a shutdown) first sends the reason: found
        here, the session is replaced with nothing in flight, instead of
        failing the call with "lost during the call" (a worker's services
        sit idle between passes; with ``idle_session_timeout = '1s'`` each
        pass met a closed session and warned). The test is one ``poll``
        call; a ping follows only when the socket is readable.
        """
        if not has_unread_input(conn):
            return
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error as exc:
            level = logging.DEBUG if self._said_closed_idle else logging.INFO
            self._said_closed_idle = True
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            logger.log(
                level,
                "%s: the server closed the idle connection (%s); reconnecting, nothing was "
                "in flight",
                self._name,
                reason,
            )
            self._drop()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            if self._conn is not None and not self._conn.closed and not self._conn.broken:
                stuck.enter(self._key, self._conn, self._watch)
                self._check_idle(self._conn)
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._drop()
                self._conn = psycopg.connect(self._conninfo, **CONNECTION_OPTIONS)
                stuck.enter(self._key, self._conn, self._watch)
                configure_connection(self._conn)
        except BaseException:
            stuck.leave(self._key)
            raise
        try:
            yield self._conn
        except RETRY_ASKED:
            raise  # the transaction failed, not the session
        except LOST_SESSION:
            self._drop()
            raise
        except psycopg.errors.FeatureNotSupported as exc:
            if stale_plan(exc):
                self._drop()
            raise
        except BaseException:
            if transaction_blocks_unbalanced(self._conn):
                self._drop()
            raise
        finally:
            stuck.leave(self._key)

    def _drop(self) -> None:
        # First: the watchdog must not cut a descriptor about to be closed
        # (its number may be reused by another socket).
        stuck.leave(self._key)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        self._drop()
