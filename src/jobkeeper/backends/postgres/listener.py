"""PostgreSQL LISTEN/NOTIFY wake-ups with a canary (internal)."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import sql

from jobkeeper.backends import forks
from jobkeeper.backends.postgres import stuck
from jobkeeper.backends.postgres.connections import PostgresConnections, describe
from jobkeeper.backends.postgres.prepared import reaches_server
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.postgres.single import SingleConnection
from jobkeeper.backends.postgres.sources import CONNECT_TIMEOUT
from jobkeeper.errors import DatabaseError

logger = logging.getLogger("jobkeeper.postgres")

#: Listener canary: seconds between self-notifications, seconds to wait for
#: the echo, and fresh connections without any echo before giving up on LISTEN.
CANARY_INTERVAL = 10.0
CANARY_TIMEOUT = 5.0
CANARY_GIVE_UP = 3
CANARY_PREFIX = "~canary:"  # "~" is not allowed in queue names


class ClosedIdle(Exception):  # noqa: N818 - reads as what happened
    """The server closed the LISTEN session for sitting idle (57P05)."""


@contextlib.contextmanager
def closed_idle_told(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Raise :class:`ClosedIdle` for a connection error of ``conn`` that
    follows the server's FATAL 57P05 (``idle_session_timeout``). A session
    waiting for notifications gets that error as a notice (libpq: no query
    was running), and the read then fails as "server closed the connection
    unexpectedly", which alone reads as a crash.
    """
    fatal: list[str] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "FATAL" and diag.sqlstate == "57P05":
            fatal.append(diag.message_primary or "idle-session timeout")

    conn.add_notice_handler(note)
    try:
        yield
    except psycopg.OperationalError as exc:
        if fatal or isinstance(exc, psycopg.errors.IdleSessionTimeout):
            told = fatal[0] if fatal else describe(exc)
            raise ClosedIdle(f"{told}: idle_session_timeout") from exc
        raise


class PostgresListener(PostgresConnections):
    """The wake-up operations of the PostgreSQL backend."""

    def listen(
        self,
        *,
        on_queue: Callable[[str], None],
        stop: threading.Event,
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
        jobs by polling every ``poll_interval``. A LISTEN connection found to
        be a pooler's (its backend PID is not the server's) gets one canary:
        through a transaction pooler every LISTEN stays on a pooled server
        session, so trying fresh connections would only leave more behind.
        """
        sender = SingleConnection(self._conninfo, "LISTEN canary sender")
        delay = 0.1
        silent_connections = 0
        said_idle_closed = False
        try:
            while not stop.is_set():
                try:
                    # Inside the loop: even naming the channel takes a query,
                    # and a refused connection here must not end the thread.
                    echoed, direct = self._listen_once(
                        self.channel(), sender, on_queue, on_due, stop
                    )
                except Exception as exc:
                    if isinstance(exc, ClosedIdle):
                        # A LISTEN session is idle by design: under an
                        # idle_session_timeout the server closes it every
                        # time. Reopened at once; the claim that follows
                        # finds what was enqueued meanwhile. Said once.
                        logger.log(
                            logging.DEBUG if said_idle_closed else logging.INFO,
                            "the server closed the idle LISTEN connection (%s); reconnecting "
                            "each time (wake-ups missed meanwhile are found by the next claim)",
                            exc,
                        )
                        said_idle_closed = True
                        delay = 0.1
                        stop.wait(delay)  # a timeout of a few ms must not spin
                        continue
                    if isinstance(exc, psycopg.Error | DatabaseError):
                        reason = describe(exc) if isinstance(exc, psycopg.Error) else str(exc)
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
                silent_connections += 1 if direct else CANARY_GIVE_UP
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
        sender: SingleConnection,
        on_queue: Callable[[str], None],
        on_due: Callable[[str, float], None] | None,
        stop: threading.Event,
    ) -> tuple[bool, bool]:
        """One LISTEN connection's life. Returns whether any canary echoed
        before the connection was given up (``False``: it never delivered),
        and whether the connection reached PostgreSQL itself (not a pooler).
        """
        token = f"{CANARY_PREFIX}{secrets.token_hex(6)}"
        echoed = False
        with (
            psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
            ) as conn,
            closed_idle_told(conn),
        ):
            forks.note(conn)
            with stuck.watched(conn, self._listen_watch()):
                direct = reaches_server(conn)
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
                    return echoed, direct
                if sent_at is None and now >= next_canary:
                    with sender.connection() as send:
                        send.execute(
                            QUERIES["notify_queues"], {"channel": channel, "queues": [token]}
                        )
                    sent_at, next_canary = now, now + CANARY_INTERVAL
        return True, direct

    def _listen_watch(self) -> stuck.Watch:
        return stuck.Watch("LISTEN connection", stuck.STUCK_AFTER, self._conninfo)

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
