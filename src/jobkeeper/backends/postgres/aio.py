"""The async producer API on PostgreSQL (internal): a psycopg
``AsyncConnectionPool`` per event loop, driving the same statement plans
as the sync backend (``plans.py``), so nothing here blocks the loop and no
enqueue logic is written twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from jobkeeper.backends import forks
from jobkeeper.backends.postgres import stuck
from jobkeeper.backends.postgres.connections import (
    DriverErrors,
    closed_before_call,
    describe,
    retry_asked,
)
from jobkeeper.backends.postgres.direct import run_direct_async
from jobkeeper.backends.postgres.flow import FlowNeeded
from jobkeeper.backends.postgres.inserts import (
    INSERT_NOW,
    insert_now_params,
    inserted_now,
    refuse_elsewhere,
)
from jobkeeper.backends.postgres.loop_pools import (
    POOL_NAME,
    LoopPool,
    close_at_loop_end,
    quiet_cancelled_connects,
    shut_down_if_skipped,
)
from jobkeeper.backends.postgres.plan_runner import run_plan_async
from jobkeeper.backends.postgres.plans import (
    Plan,
    get_plan,
    insert_plan,
    is_single_statement,
    read_for_insert,
)
from jobkeeper.backends.postgres.pool_setup import ServerProbe, SetupFailures
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.postgres.session_setup import require_iso_datestyle, set_up_async
from jobkeeper.backends.postgres.settling import SettlingConnection, unsettled_reason
from jobkeeper.backends.postgres.sources import RETRY_ASKED, load_json_safely
from jobkeeper.database_url import DatabaseURL
from jobkeeper.errors import DatabaseError, DatabaseUnavailable
from jobkeeper.models import Job, NewJob

logger = logging.getLogger("jobkeeper.postgres")

T = TypeVar("T")

#: Retries of an own transaction PostgreSQL aborted asking for a retry, and
#: the pause's scale (as the sync insert's).
RETRIES = 5
RETRY_PAUSE = 0.02


def _reused_cursor_async(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncCursor[Any]:
    """As the sync ``reused_cursor``: one tuple-row cursor per connection."""
    cursor: psycopg.AsyncCursor[Any] | None = getattr(conn, "_jobkeeper_cursor", None)
    if cursor is None or cursor.closed:
        cursor = conn.cursor(row_factory=tuple_row)
        conn._jobkeeper_cursor = cursor  # type: ignore[attr-defined]
    return cursor


async def _configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    forks.note(conn)
    load_json_safely(conn)
    await set_up_async(conn)


class PostgresAsync:
    """The async half of the PostgreSQL backend (mixed into it)."""

    _conninfo: str
    _pool_size: int
    url: DatabaseURL
    _async_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPool]
    _async_checked: weakref.WeakSet[psycopg.AsyncConnection[Any]]

    def _errors(self) -> DriverErrors:
        raise NotImplementedError

    def channel(self) -> str:
        raise NotImplementedError

    def _remember_schema(self, schema: str | None) -> str:
        raise NotImplementedError

    def _pool_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    async def _async_pool(self) -> LoopPool:
        # A pool's background tasks belong to the loop that opened it.
        loop = asyncio.get_running_loop()
        found = self._async_pools.get(loop)
        if found is None:
            self._close_pools_of_closed_loops()
            quiet_cancelled_connects()
            opened: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()
            failures = SetupFailures()

            async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
                opened.add(conn)
                try:
                    await _configure_async(conn)
                except BaseException as exc:
                    # The pool drops a connection whose configure failed
                    # without closing it: cancelled at the loop's end, this
                    # one would stay open until the garbage collector came.
                    await conn.close()
                    if isinstance(exc, Exception):
                        failures.failed(exc)  # told apart from a busy pool
                    raise
                failures.succeeded()

            pool: AsyncConnectionPool = AsyncConnectionPool(
                self._conninfo,
                min_size=1,
                max_size=self._pool_size,
                kwargs=self._pool_kwargs(),
                open=False,
                name=POOL_NAME,
                configure=configure,
                # Its wait settles a cancelled statement however often the
                # caller is cancelled meanwhile (see settling.py).
                connection_class=SettlingConnection,
            )
            probe = ServerProbe(self._conninfo, self._pool_kwargs(), _configure_async, failures)
            found = LoopPool(pool, probe, opened, self._conninfo)
            self._async_pools[loop] = found

            def forget(loop_pool: LoopPool = found) -> None:
                if self._async_pools.get(loop) is loop_pool:
                    del self._async_pools[loop]

            found.closer = loop.create_task(
                close_at_loop_end(found, forget), name="jobkeeper-async-pool-closer"
            )
            found.closer.add_done_callback(
                functools.partial(shut_down_if_skipped, loop_pool=found, forget=forget)
            )
            await pool.open(wait=False)
        return found

    async def _with_cursor(
        self,
        body: Callable[[psycopg.AsyncCursor[Any]], Awaitable[T]],
        *,
        transaction: bool,
        writes: bool = False,
    ) -> T:
        """Run ``body`` on a cursor of a connection of this loop's pool (in a
        transaction of its own when ``transaction``), driver errors
        translated. A coroutine taking the body, not an async context
        manager: every async call goes through it, and an
        ``asynccontextmanager``'s generator cost ~5% of an enqueue_async.
        ``writes``: a cancel the server never confirms is said to leave the
        write unsettled (see :func:`_unsettled`).

        ``body`` is one statement, one transaction or reads: it runs once
        more on another connection when the server had closed the session
        for sitting idle before it reached it (as the sync ``_once_more``).
        """
        for rerun in (False, True):
            try:
                return await self._with_cursor_once(body, transaction, writes)
            except DatabaseUnavailable as exc:
                if rerun or not closed_before_call(exc):
                    raise
                logger.debug("%s; running the call once more on another session", exc)
        raise AssertionError("unreachable")

    async def _with_cursor_once(
        self,
        body: Callable[[psycopg.AsyncCursor[Any]], Awaitable[T]],
        transaction: bool,
        writes: bool,
    ) -> T:
        with self._errors() as call:
            loop_pool = await self._async_pool()
            # The spare or getconn/putconn, not ``pool.connection()``: that
            # one wraps the call in ``async with conn``, whose commit has
            # nothing to do in autocommit (transactions are
            # ``conn.transaction()`` blocks) but took the connection's lock
            # and a wait, ~4% of an enqueue's CPU. A connection left in a
            # transaction is never kept as the spare: putconn rolls it back
            # and warns, as the sync pool's does.
            conn = await loop_pool.checkout()
            call.checked_out = True
            call.connection = conn
            failed = True
            try:
                # Watched for an answer that never comes (a dict set and a
                # pop per call): the watchdog's thread cuts the socket, and
                # the await fails as a lost connection. Left before the
                # connection is closed or given back (see stuck._cut).
                stuck.enter(id(conn), conn, loop_pool.watch)
                try:
                    cursor = _reused_cursor_async(conn)
                    if transaction:
                        async with conn.transaction():
                            result = await body(cursor)
                    else:
                        result = await body(cursor)
                finally:
                    stuck.leave(id(conn))
                failed = False
                return result
            except BaseException as exc:
                if writes and isinstance(exc, asyncio.CancelledError) and conn.closed:
                    _unsettled(exc, unsettled_reason(conn))
                await loop_pool.repair(conn, exc)
                raise
            finally:
                await loop_pool.checkin(conn, failed)

    async def _run_async(
        self, make_plan: Callable[[], Plan], *, transaction: bool, writes: bool = False
    ) -> Any:
        return await self._with_cursor(
            lambda cursor: run_plan_async(cursor, make_plan(), QUERIES),
            transaction=transaction,
            writes=writes,
        )

    async def _channel_async(self) -> str:
        if getattr(self, "_schema", None) is None:
            # Looked up once per backend, on this loop's pool: the sync pool
            # would open sessions an async application never uses otherwise.
            async def current_schema(cursor: psycopg.AsyncCursor[Any]) -> str | None:
                await cursor.execute(QUERIES["notify_channel"])
                row = await cursor.fetchone()
                return None if row is None else row[0]

            self._remember_schema(await self._with_cursor(current_schema, transaction=False))
        return self.channel()

    async def job_insert_many_async(
        self, *, jobs: Sequence[NewJob], connection: Any = None
    ) -> list[Job]:
        if not jobs:
            return []
        jobs = read_for_insert(jobs)
        channel = await self._channel_async()
        if connection is not None:
            return await self._insert_on_async(connection, jobs, channel)
        # As the sync insert: one statement when it can be, again in a
        # transaction with the flow checks when it meets a limited queue.
        in_transaction = not is_single_statement(jobs)
        now_params = insert_now_params(jobs[0], channel) if len(jobs) == 1 else None
        for retry in range(RETRIES + 1):
            try:
                if now_params is not None and not in_transaction:
                    # The usual single enqueue, without a plan to drive (as
                    # the sync backend's _insert_now).
                    rows = await self._with_cursor(
                        lambda cursor: run_direct_async(cursor.connection, INSERT_NOW, now_params),
                        transaction=False,
                        writes=True,
                    )
                    return [inserted_now(jobs[0], rows)]
                result: list[Job] = await self._run_async(
                    lambda checked=in_transaction: insert_plan(  # type: ignore[misc]
                        jobs, channel, in_transaction=checked
                    ),
                    transaction=in_transaction,
                    writes=True,
                )
                return result
            except FlowNeeded:
                in_transaction = True
                continue
            except DatabaseError as exc:
                if retry == RETRIES or not retry_asked(exc):
                    raise
                logger.debug("insert aborted (%s); running it again", exc)
            await asyncio.sleep(random.uniform(0, RETRY_PAUSE * 2**retry))
        raise AssertionError("unreachable")

    async def _insert_on_async(
        self, connection: Any, jobs: Sequence[NewJob], channel: str
    ) -> list[Job]:
        """The insert in the caller's ``AsyncConnection``: a savepoint in its
        open transaction (or a transaction of its own when it autocommits),
        so the jobs commit or roll back with the caller's work.
        """
        if not isinstance(connection, psycopg.AsyncConnection):
            raise TypeError(
                "connection= of an async call must be a psycopg 3 AsyncConnection to this "
                f"database, got {type(connection).__module__}.{type(connection).__name__}"
            )
        require_iso_datestyle(connection)
        with self._errors():
            await self._check_same_database_async(connection)
            if not connection.autocommit:
                await connection.execute(
                    QUERIES["job_insert_many_open_transaction"]
                )  # open the caller's transaction
            try:
                async with (
                    connection.transaction(),
                    connection.cursor(row_factory=tuple_row) as cursor,
                ):
                    load_json_safely(cursor)  # a unique duplicate may be any stored row
                    result: list[Job] = await run_plan_async(
                        cursor, insert_plan(jobs, channel, in_transaction=True), QUERIES
                    )
                    return result
            except RETRY_ASKED as exc:
                if connection.autocommit:
                    raise
                raise DatabaseError(
                    f"PostgreSQL aborted the caller's transaction ({describe(exc)}): "
                    "roll it back and retry the whole transaction (none of it was committed)"
                ) from exc

    async def _check_same_database_async(self, connection: psycopg.AsyncConnection[Any]) -> None:
        if connection in self._async_checked:
            return
        query = QUERIES["job_insert_many_same_database"]
        cursor = await connection.execute(query)
        theirs = await cursor.fetchone()

        async def read_ours(cursor: psycopg.AsyncCursor[Any]) -> Any:
            await cursor.execute(query)
            return await cursor.fetchone()

        ours = await self._with_cursor(read_ours, transaction=False)
        refuse_elsewhere(theirs, ours, self.url.migrate_hint())
        self._async_checked.add(connection)

    async def job_get_async(self, *, job_id: int) -> Job | None:
        job: Job | None = await self._run_async(lambda: get_plan(job_id), transaction=False)
        return job

    async def job_mark_awaited_async(self, *, job_id: int) -> None:
        async def mark(cursor: psycopg.AsyncCursor[Any]) -> None:
            await cursor.execute(QUERIES["job_mark_awaited"], {"id": job_id})

        await self._with_cursor(mark, transaction=False)

    async def aclose(self) -> None:
        """Close the async pool of the running loop."""
        found = self._async_pools.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found.close()

    def _close_async_pools(self) -> None:
        """From the sync ``close``: a pool of a loop that is not running is
        closed on it; one of a closed loop, without it; one of a loop that
        runs (another thread's, or this one's, blocked in this call) by a
        task sent to that loop, not waited for. Dropped unclosed, a running
        loop's pool kept its sessions, and the loop's next call opened
        another: a thread closing the queue over and over while others ran
        their loops filled max_connections.
        """
        self._close_pools_of_closed_loops()
        for loop, found in list(self._async_pools.items()):
            self._async_pools.pop(loop, None)
            if loop.is_running():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    asyncio.run_coroutine_threadsafe(found.close(), loop)
                continue
            with contextlib.suppress(Exception):
                loop.run_until_complete(found.close())

    def _close_pools_of_closed_loops(self) -> None:
        """Close the connections of pools whose loop was closed without
        ending them (``loop.close()`` with no ``aclose()``): found when a
        new loop opens its pool, or at ``close``.
        """
        for loop, found in list(self._async_pools.items()):
            if loop.is_closed():
                self._async_pools.pop(loop, None)
                found.close_after_loop()


#: What a cancelled enqueue says when it could not be settled, after why.
UNSETTLED = (
    "jobkeeper closed the connection, and a statement it had sent may still run on the "
    "server. The enqueue may commit after this: look the job up, or give it a "
    "unique_key, before enqueueing it again"
)


def _unsettled(cancelled: asyncio.CancelledError, reason: str | None) -> None:
    """Say so on ``cancelled`` (a note on the exception, a WARNING) when a
    cancelled enqueue could not be settled, with ``reason`` (see
    ``settling.SettlingConnection``): the server answered neither the
    statement nor the cancel request within the bound (frozen, or a cut
    network: a write still in its socket buffer runs when it thaws), the
    connection was lost meanwhile, or the loop ended first.
    """
    why = reason or "the connection closed before this enqueue's cancel was settled"
    cancelled.add_note(f"jobkeeper: {why}: {UNSETTLED}")
    logger.warning("enqueue cancelled, but %s: %s", why, UNSETTLED)
