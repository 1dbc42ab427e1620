"""PostgreSQL wake-ups for ``wait`` (internal): one LISTEN connection per
process and database, woken by the NOTIFY that the end of an awaited job
sends (migration 0006: the ``awaited`` flag and its trigger).

A LISTEN connection only reads: one whose server (or proxy) stopped
answering while its socket stayed open looked healthy for ever, and every
wait went unwoken until its 30 s re-read (``waiting.RECHECK``). It is
pinged every :data:`LISTEN_PING` seconds under the stuck-call watchdog
(:mod:`.stuck`), which cuts a ping the server never got; the watch then
wakes every waiter to re-read, and listens again on a new connection.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from jobkeeper.backends import forks
from jobkeeper.backends.postgres import stuck
from jobkeeper.backends.postgres.prepared import reaches_server
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.postgres.sources import PING_STUCK_AFTER
from jobkeeper.backends.watch import CompletionWatch, watch_for
from jobkeeper.database_url import redact_secrets

logger = logging.getLogger("jobkeeper.postgres")

#: Seconds between looks at whether the watch should stop, while idle.
LISTEN_SLICE = 0.5
CONNECT_TIMEOUT = 5
#: Seconds between pings of the LISTEN connection while it is idle: a
#: silent one is then found within about this plus the ping's threshold
#: (``sources.PING_STUCK_AFTER``, the pools' pre-use ping's: it asks nothing
#: of the server) and the watchdog's probe.
LISTEN_PING = 5.0
#: Seconds a LISTEN made through a pooler has to hear its own canary before
#: this process's waiters give up on wake-ups through that URL.
POOLER_ECHO_WAIT = 5.0
CANARY_PREFIX = "~canary:"  # a job id never starts with "~"
#: The URLs whose LISTEN was found not to deliver (a pooler in transaction
#: mode): their watch never LISTENs again in this process, for each LISTEN
#: there stays on a pooled server session, which the pooler then warns
#: about on every notification it cannot hand to a client.
_SILENT: set[str] = set()
#: What the watchdog's log lines call the connection, and its ping.
LISTEN_NAME = "jobkeeper wait LISTEN connection"
PING_NAME = "jobkeeper wait LISTEN connection (ping)"
_silent_lock = threading.Lock()


def done_channel(schema: str) -> str:
    """The channel the trigger notifies on (same rule as its SQL)."""
    if len(schema.encode()) > 48:
        schema = hashlib.md5(schema.encode()).hexdigest()
    return f"jobkeeper_done_{schema}"


def _idle(watch: CompletionWatch) -> None:
    """Keep the watch thread, watching nothing, until nobody waits."""
    watch.set_unwatched()
    while not watch.should_stop():
        time.sleep(LISTEN_SLICE)


class _ListenSource:
    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo

    def run(self, watch: CompletionWatch) -> None:
        """LISTEN for the ends of awaited jobs. On a session of PostgreSQL
        itself, ready at once. Through a pooler, waiters poll until a canary
        NOTIFYed from another connection comes back: it does through a
        session pooler, never through a transaction pooler, where a LISTEN
        reaches whichever server session runs it and no notification comes
        back to this client (the process then polls for good).
        """
        if self._conninfo in _SILENT:
            _idle(watch)
            return
        with psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        ) as conn:
            forks.note(conn)
            with stuck.watched(conn, stuck.Watch(LISTEN_NAME, stuck.STUCK_AFTER, self._conninfo)):
                row = conn.execute(QUERIES["notify_channel"]).fetchone()
                if row is None or row[0] is None:
                    raise psycopg.OperationalError("no current schema (check search_path)")
                channel = done_channel(row[0])
                direct = reaches_server(conn)
                if not direct:
                    watch.set_unwatched()
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            token = f"{CANARY_PREFIX}{secrets.token_hex(6)}"
            echo_by: float | None = None
            if direct:
                self._ready(watch)
            else:
                self._send_canary(channel, token)
                echo_by = time.monotonic() + POOLER_ECHO_WAIT
            ping_at = time.monotonic() + LISTEN_PING
            try:
                while not watch.should_stop():
                    # The timeout bounds the whole generator (psycopg 3.2+),
                    # so should_stop() is looked at every LISTEN_SLICE.
                    for notify in conn.notifies(timeout=LISTEN_SLICE):
                        if notify.payload == token:
                            echo_by = None
                            self._ready(watch)
                        elif notify.payload.isdigit():
                            watch.deliver((int(notify.payload),))
                    if echo_by is not None and time.monotonic() > echo_by:
                        break
                    if time.monotonic() >= ping_at:
                        self._ping(conn, watch)
                        ping_at = time.monotonic() + LISTEN_PING
            except BaseException:
                watch.set_ready(False)
                raise
        if echo_by is not None:
            self._give_up()
            _idle(watch)

    def _ping(self, conn: psycopg.Connection[Any], watch: CompletionWatch) -> None:
        """An empty query on the LISTEN connection, watched by the stuck-call
        watchdog: unanswered, it is cut, and the error ends this source (the
        watch wakes every waiter and listens again on a new connection).
        Notifications that come with its answer are delivered.

        Raises:
            psycopg.Error: the ping failed or was cut.
        """
        heard: list[int] = []

        def note(notify: psycopg.Notify) -> None:
            if notify.payload.isdigit():
                heard.append(int(notify.payload))

        # A handler for the ping's length: notifications read during a
        # query go to handlers; without one, older psycopg drops them.
        conn.add_notify_handler(note)
        try:
            with stuck.watched(conn, stuck.Watch(PING_NAME, PING_STUCK_AFTER, self._conninfo)):
                ConnectionPool.check_connection(conn)
        finally:
            conn.remove_notify_handler(note)
        if heard:
            watch.deliver(heard)

    @staticmethod
    def _ready(watch: CompletionWatch) -> None:
        watch.set_ready(True)
        # Ends that committed while the connection was being made were
        # not heard: every waiter re-reads once now that nothing is missed.
        watch.deliver_all()

    def _send_canary(self, channel: str, token: str) -> None:
        with psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        ) as sender:
            sender.execute(QUERIES["notify_queues"], {"channel": channel, "queues": [token]})

    def _give_up(self) -> None:
        with _silent_lock:
            if self._conninfo in _SILENT:
                return
            _SILENT.add(self._conninfo)
        logger.warning(
            "wait: LISTEN/NOTIFY does not reach this process through %s (a pooler in "
            "transaction mode?): waits poll every poll_interval; point the waiting "
            "process at PostgreSQL itself, or a session pooler, for instant wake-ups",
            redact_secrets(self._conninfo),
        )


class PostgresWaiting:
    """The waiting half of the PostgreSQL backend (mixed into it)."""

    _conninfo: str

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def job_mark_awaited(self, *, job_id: int) -> None:
        self._fetch("job_mark_awaited", {"id": job_id})

    def completion_watch(self) -> CompletionWatch:
        return watch_for(
            f"postgresql:{self._conninfo}", lambda: _ListenSource(self._conninfo), "postgresql"
        )


def _after_fork_in_child() -> None:
    global _silent_lock
    # A thread of the parent may have held it at the fork.
    _silent_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
