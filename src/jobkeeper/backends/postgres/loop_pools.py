"""Each event loop's psycopg ``AsyncConnectionPool`` for the async producer
API (internal): the checkout check, the probe that tells a busy pool from a
server that is gone, the loop's spare connection, and the task that closes
it all when the loop ends. Used by :mod:`jobkeeper.backends.postgres.aio`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobkeeper.backends.postgres import sources, stuck
from jobkeeper.backends.postgres.pool_logs import mark_on_purpose
from jobkeeper.backends.postgres.pool_setup import ServerProbe, busy_pool_message
from jobkeeper.backends.postgres.settling import finish
from jobkeeper.backends.postgres.sources import IDLE_CHECK_AFTER, has_unread_input

#: The name of every loop's pool (psycopg_pool's log lines carry it).
POOL_NAME = "jobkeeper-async"
#: Seconds a connection may serve as a loop's spare (see ``LoopPool``)
#: before it goes back to the pool, which renews it past its ``max_lifetime``.
SPARE_RETURN = 60.0


class CancelledConnects(logging.Filter):
    """Drops psycopg_pool's warning about a connect of our pools that was
    cancelled: it logs ``error connecting in 'jobkeeper-async': `` (the
    ``CancelledError``'s empty text) for each connect still running when a
    loop ends (``asyncio.run()`` cancels every task) -- the end of a script,
    not an error, and nothing is lost. Other connect errors pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.msg == "error connecting in %r: %s"
            and isinstance(args, tuple)
            and len(args) == 2
            and args[0] == POOL_NAME
            and isinstance(args[1], asyncio.CancelledError)
        )


def quiet_cancelled_connects() -> None:
    """Install :class:`CancelledConnects` on psycopg_pool's logger, once."""
    pool_logger = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, CancelledConnects) for f in pool_logger.filters):
        pool_logger.addFilter(CancelledConnects())


def watches(conninfo: str) -> tuple[stuck.Watch, stuck.Watch]:
    """What the stuck-call watchdog knows of a loop pool's calls, and of its
    pre-use pings: the sync pool's thresholds (``POOL_TIMEOUT``,
    ``PING_STUCK_AFTER``). Its thread cuts the socket (``stuck._cut``), and
    the call's await then fails as a lost connection: the loop never blocks.
    """
    return (
        stuck.Watch(f"{sources.APPLICATION_NAME} (async pool)", sources.POOL_TIMEOUT, conninfo),
        stuck.Watch(
            f"{sources.APPLICATION_NAME} (async pool, pre-use ping)",
            sources.PING_STUCK_AFTER,
            conninfo,
        ),
    )


async def ping_async(conn: psycopg.AsyncConnection[Any], watch: stuck.Watch) -> None:
    """``check_connection`` watched by the stuck-call watchdog: an async
    enqueue waited in an unanswered ping for as long as the silence lasted.

    Raises:
        psycopg.Error: the ping failed, or was cut (``stuck.cut_reason``).
    """
    with stuck.watched(conn, watch):
        await AsyncConnectionPool.check_connection(conn)


async def check_async(conn: psycopg.AsyncConnection[Any], watch: stuck.Watch) -> None:
    """The async pool's checkout check, as the sync pool's (see
    ``PooledConnections._alive``): a ping only for a connection that idled
    past ``IDLE_CHECK_AFTER`` or whose socket is readable (a server ending a
    session says why first); a ping on every checkout cost a round trip per
    call. ``watch``: the ping's, for the stuck-call watchdog.

    Raises:
        psycopg.Error: the ping failed (the pool then replaces the connection).
    """
    returned_at: float = getattr(conn, "_jobkeeper_returned_at", 0.0)
    if time.monotonic() - returned_at <= IDLE_CHECK_AFTER and not has_unread_input(conn):
        return
    await ping_async(conn, watch)


async def drain_if_cut(pool: AsyncConnectionPool, conn: psycopg.AsyncConnection[Any]) -> None:
    """After a ping the watchdog cut: the pool's other sessions, opened
    alike, likely lead to the same silence; new ones are opened (as the
    sync pool does).
    """
    if stuck.cut_reason(conn) is not None:
        # Finished despite a cancel: one between its clearing of the pool
        # and its replacements left the drained slots counted as used.
        await finish(pool.drain())


def cancels_asked() -> int:
    """How many cancels of the running task are pending (``Task.cancelling``).

    On Python 3.11, ``asyncio.wait_for`` returns the result of what it
    awaited when that ended in the loop step that cancelled the caller, and
    the cancel is lost (3.12 builds wait_for on ``asyncio.timeout`` and
    keeps it). psycopg_pool's async ``getconn`` waits in such a wait_for
    (its condition's ``wait_timeout``): a cancelled ``wait_async`` then ran
    until its job ended, and ``asyncio.run()`` never returned. A swallowed
    cancel still counts here (nothing uncancels it), so a count that grew
    across an await says to raise ``CancelledError`` after it.
    """
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


async def getconn_async(
    pool: AsyncConnectionPool, probe: ServerProbe, ping_watch: stuck.Watch
) -> psycopg.AsyncConnection[Any]:
    """A connection from ``pool``, as the sync pool's ``_getconn``: waits up
    to ``POOL_TIMEOUT`` while the pool is busy, but fails within about
    ``POOL_SLICE`` when the server is down. The pool alone retried its
    connects in the background until its own timeout, so an async enqueue
    with the server down hung for 30 seconds where the sync one failed at once.
    ``ping_watch``: the pre-use ping's, for the stuck-call watchdog.

    Raises:
        psycopg.OperationalError: the server refused a direct connection.
        psycopg_pool.PoolTimeout: no connection within ``POOL_TIMEOUT``.
    """
    # Read from the module at each call, as the sync pool does: a setting
    # changed at run time (the soak shortens it) reaches both.
    deadline = time.monotonic() + sources.POOL_TIMEOUT
    while True:
        if probe.suspect:
            await probe.check()
        remaining = deadline - time.monotonic()
        try:
            conn = await pool.getconn(timeout=max(min(sources.POOL_SLICE, remaining), 0.001))
        except PoolTimeout:
            if time.monotonic() >= deadline:
                why = busy_pool_message(sources.POOL_TIMEOUT, pool, probe.failures)
                raise PoolTimeout(why) from None
            # Busy, or the server went away: a probe tells which.
            probe.suspect = True
            continue
        # Checked here, not by the pool's ``check``: psycopg_pool waits 1 s,
        # then 2, 4... between connections that fail it, so a call after the
        # server had closed the pool's idle sessions (a restart, an
        # idle_session_timeout) waited 7.6 s to reach the fourth.
        alive = False
        try:
            await check_async(conn, ping_watch)
            alive = True
        except psycopg.Error:
            probe.suspect = True  # cut: the probe says at once if the server is gone
            await drain_if_cut(pool, conn)
        finally:
            # A cancel during the ping gives the connection back too.
            if not alive:
                await discard(pool, conn)
        if alive:
            return conn
        if time.monotonic() >= deadline:
            raise PoolTimeout(f"no live connection within {sources.POOL_TIMEOUT:g}s")


async def discard(pool: AsyncConnectionPool, conn: psycopg.AsyncConnection[Any]) -> None:
    """Close ``conn`` and give it back to ``pool``, which opens a replacement
    (and, the close being ours, does not log it: see ``pool_logs``).
    """
    mark_on_purpose(conn)
    await finish(_close_and_put(pool, conn))


async def _close_and_put(pool: AsyncConnectionPool, conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    finally:
        await pool.putconn(conn)


class LoopPool:
    """One event loop's pool, its server probe, the connections it opened,
    the task that closes it when the loop ends (:func:`close_at_loop_end`),
    and the spare: one connection kept out of the pool between calls.

    The spare serves calls one at a time without the pool: psycopg_pool's
    async ``getconn`` and ``putconn`` (its lock, its waiting list, its
    return path) cost ~85k instructions a call, a fifth of an
    ``enqueue_async`` (callgrind), where taking the spare costs a field
    read. Calls that overlap take the pool's other connections. The spare
    is checked on checkout as a pooled connection is (``check_async``),
    never kept after an error, and given back to the pool every
    ``SPARE_RETURN`` seconds so that the pool's ``max_lifetime`` still
    renews it. While calls wait for the pool, no connection is kept as the
    spare: each goes back to the pool, which serves its waiters in turn
    (kept, a call that followed its own returned and retook it at once, and
    with more callers than ``pool_size`` the others waited until
    ``POOL_TIMEOUT`` and failed).
    """

    __slots__ = (
        "closed",
        "closer",
        "opened",
        "ping_watch",
        "pool",
        "probe",
        "spare",
        "waiting",
        "watch",
    )

    def __init__(
        self,
        pool: AsyncConnectionPool,
        probe: ServerProbe,
        opened: weakref.WeakSet[psycopg.AsyncConnection[Any]],
        conninfo: str,
    ) -> None:
        self.pool = pool
        self.probe = probe
        #: The stuck-call watchdog's: of a call, and of a pre-use ping.
        self.watch, self.ping_watch = watches(conninfo)
        #: Every connection the pool opened (its ``configure`` notes them).
        self.opened = opened
        self.closer: asyncio.Task[None] | None = None
        self.spare: psycopg.AsyncConnection[Any] | None = None
        #: Set once the closer runs: nothing is kept as the spare after it.
        self.closed = False
        #: Calls now waiting for a pooled connection.
        self.waiting = 0

    async def checkout(self) -> psycopg.AsyncConnection[Any]:
        """The spare when it is free and alive, else a pooled connection;
        a cancel of the caller that psycopg_pool swallowed meanwhile is
        raised here, the connection given back (see :func:`cancels_asked`).

        Raises:
            asyncio.CancelledError: the caller was cancelled.
            As :func:`getconn_async`.
        """
        asked = cancels_asked()
        conn = await self._checkout()
        if cancels_asked() > asked:
            await self.give_back(conn)
            raise asyncio.CancelledError
        return conn

    async def _checkout(self) -> psycopg.AsyncConnection[Any]:
        conn = self.spare
        if conn is not None and self.waiting:
            # Calls came first: the spare joins the pool, and this call the queue.
            self.spare = None
            await self.give_back(conn)
            conn = None
        if conn is not None:
            self.spare = None
            alive = False
            try:
                if not self.probe.suspect:
                    await check_async(conn, self.ping_watch)
                else:
                    # Suspected (often only a busy pool: a getconn slice ran
                    # out): a ping of the spare answers for the server, where
                    # discarding it closed a healthy session and logged it.
                    await ping_async(conn, self.ping_watch)
                    self.probe.suspect = False
                alive = True
            except psycopg.Error:
                self.probe.suspect = True  # cut: the server may be gone
                await drain_if_cut(self.pool, conn)
            finally:
                # Also when the call is cancelled during the ping: a spare
                # neither kept nor given back held a pool slot for good.
                if not alive:
                    await self._discard(conn)
            if alive:
                return conn
        self.waiting += 1
        try:
            conn = await getconn_async(self.pool, self.probe, self.ping_watch)
        finally:
            self.waiting -= 1
        conn._jobkeeper_taken_at = time.monotonic()  # type: ignore[attr-defined]
        return conn

    async def checkin(self, conn: psycopg.AsyncConnection[Any], failed: bool) -> None:
        """Keep ``conn`` as the spare after a call that succeeded, unless
        there is one or it is time the pool had it back; else give it back.
        """
        now = conn._jobkeeper_returned_at = time.monotonic()  # type: ignore[attr-defined]
        if (
            not failed
            and self.spare is None
            and not self.waiting
            and not self.closed
            and not conn.closed
            and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            and now - getattr(conn, "_jobkeeper_taken_at", now) < SPARE_RETURN
        ):
            self.spare = conn
            return
        await self.give_back(conn)

    async def give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """``putconn``, finished even if the caller is cancelled while it
        waits on the pool's lock (see :mod:`.settling`).
        """
        await finish(self.pool.putconn(conn))

    async def repair(self, conn: psycopg.AsyncConnection[Any], error: BaseException) -> None:
        """After a call on ``conn`` failed with ``error``: probe the server
        before the next checkout, or replace every session, as the error
        asks (``sources.pool_repair``); ``conn`` is checked in after.
        """
        suspect, replace_all = sources.pool_repair(error)
        self.probe.suspect = self.probe.suspect or suspect
        if replace_all:
            mark_on_purpose(conn)
            await conn.close()
            spare, self.spare = self.spare, None
            if spare is not None:
                await self._discard(spare)
            await finish(self.pool.drain())

    async def _discard(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await discard(self.pool, conn)

    async def close(self) -> None:
        """Cancel the closer and wait for its end, then shut down here if it
        skipped its body (cancelled before its first step: a call opened the
        pool in the loop iteration that cancelled it). Awaited to its end,
        the closer is not left pending: a loop closed right after would
        report it destroyed while pending.
        """
        if self.closer is not None:
            self.closer.cancel()
            await asyncio.wait({self.closer})
        await self.shut_down()

    async def shut_down(self) -> None:
        """Close the pool, then what it opened and left open; once (later
        calls return at once). See :func:`close_at_loop_end`.
        """
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.pool.close()
        await self.close_connections()

    def close_after_loop(self) -> None:
        """Close what the pool opened, without its loop: one closed without
        ``asyncio.run()`` or ``aclose()`` (``loop.close()``), whose tasks
        will never run again. Its sessions stayed open for good.
        """
        self.closed = True
        self.spare = None
        for conn in list(self.opened):
            if not conn.closed:
                with contextlib.suppress(Exception):
                    conn.pgconn.finish()

    async def close_connections(self) -> None:
        """Close what the pool opened and left open (see :func:`close_at_loop_end`)."""
        self.spare = None
        for conn in list(self.opened):
            if conn.closed or conn.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                # Active: a task cancelled with the loop's others is still
                # cancelling its query; closed under it, psycopg logs
                # "query cancellation interrupted". That task closes it (a
                # configure, see aio) or gives it to the closed pool, which does.
                continue
            await conn.close()


async def close_at_loop_end(loop_pool: LoopPool, forget: Callable[[], None]) -> None:
    """Wait until cancelled, then close ``loop_pool`` (``forget`` drops it first).

    ``asyncio.run()`` cancels the tasks left when its coroutine returns and
    waits for them all. A psycopg_pool worker task that a cancel reaches
    while it runs a job (a background connect, a connection's return)
    swallows it -- the worker's loop catches ``CancelledError`` with the
    job's errors (``psycopg_pool/pool_async.py``, ``worker``) -- and waits on
    its queue again: ``asyncio.run()`` never returned, in about one run in
    four, for an app that enqueued and did not await ``aclose()``. Closing
    the pool sends every worker a stop that its queue does deliver. The
    other workers were cancelled with every task, so ``close()`` ends in
    their ``CancelledError`` before it closes the idle connections, which
    would then stay open until the garbage collector found them (51 server
    sessions after ten runs of 30 enqueues): they are closed here.

    A closer cancelled before its first step never runs this body: whoever
    cancelled it then shuts the pool down (``aclose``), or
    :func:`shut_down_if_skipped` does.
    """
    try:
        await asyncio.get_running_loop().create_future()
    except asyncio.CancelledError:
        forget()
        await loop_pool.shut_down()
        raise


def shut_down_if_skipped(
    closer: asyncio.Task[None], loop_pool: LoopPool, forget: Callable[[], None]
) -> None:
    """The closer's done callback: a closer cancelled before its first step
    (by ``asyncio.run()`` ending the loop in the iteration in which a task
    opened the pool) skipped its body, and the pool's workers would wait on
    their queues for good; its shut-down runs as a task of its own instead.
    ``aclose`` shuts the pool down itself after this runs (the callback,
    added first, runs first), and a shut-down runs once.
    """
    if loop_pool.closed or closer.get_loop().is_closed():
        return
    forget()
    closer.get_loop().create_task(loop_pool.shut_down(), name="jobkeeper-async-pool-shut-down")
