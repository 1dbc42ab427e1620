"""Cancels of PostgreSQL async calls, however often they come: a cancelled
enqueue is settled before the caller sees the cancel (nothing of it commits
later), and every connection goes back to its loop's pool.

Cancelled twice (``task.cancel()``, a loop step, ``task.cancel()``; anyio's
cancel scopes, Starlette's and FastAPI's, cancel at every step), psycopg
closed the connection without sending the cancel request, and the INSERT
the server was running committed after the caller saw the cancel. A cancel
while ``putconn`` waited on the pool's lock left the connection neither in
the pool nor closed: the pool counted its slot as used for the loop's life.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.postgres import settling
from jobkeeper.backends.postgres.aio import UNSETTLED
from support.db import count

#: Seconds the enqueue waits on the table lock before it is cancelled.
CANCEL_AFTER = 0.3


@contextlib.asynccontextmanager
async def table_locked(url: str) -> AsyncIterator[None]:
    """Another session holds a lock every INSERT into the jobs table waits
    for (as a migration or a VACUUM FULL would), released on exit.
    """
    holder = await psycopg.AsyncConnection.connect(url)
    try:
        await holder.execute("LOCK TABLE jobkeeper_jobs IN EXCLUSIVE MODE")
        yield
    finally:
        await holder.rollback()
        await holder.close()


async def cancelled_twice(call: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(call)
    await asyncio.sleep(CANCEL_AFTER)
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()
    await task


async def anyio_deadline(call: Awaitable[Any]) -> None:
    import anyio

    with anyio.fail_after(CANCEL_AFTER):
        await call


async def cancelled_once(call: Awaitable[Any]) -> None:
    async with asyncio.timeout(CANCEL_AFTER):
        await call


CANCELS: dict[str, Callable[[Awaitable[Any]], Awaitable[None]]] = {
    "once": cancelled_once,
    "twice": cancelled_twice,
    "anyio": anyio_deadline,
}


@pytest.mark.parametrize("cancel", list(CANCELS))
@pytest.mark.parametrize("many", [False, True], ids=["single", "batch"])
def test_a_cancelled_enqueue_never_commits_after_the_caller_saw_the_cancel(
    pg_url, caplog, cancel, many
):
    if cancel == "anyio":
        pytest.importorskip("anyio")  # the dashboard extra's Starlette brings it
    jq = JobQueue(pg_url)
    jq.migrate()
    seen: list[BaseException] = []

    async def main() -> None:
        await jq.enqueue_async("warm", {})  # the loop's pool is open and warm
        async with table_locked(pg_url):
            if many:
                call = jq.enqueue_many_async([("cancelled", {"n": n}) for n in range(3)])
            else:
                call = jq.enqueue_async("cancelled", {})
            try:
                await CANCELS[cancel](call)
            except (asyncio.CancelledError, TimeoutError) as exc:
                seen.append(exc)
            # The caller saw the cancel: nothing of the enqueue may land now.
            assert count(pg_url, where="task = 'cancelled'") == 0
        await asyncio.sleep(0.3)
        await jq.aclose()

    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(main())
        assert seen, "the enqueue was not cancelled"
        assert count(pg_url, where="task = 'cancelled'") == 0
        # Settled: no word of a cancel the database did not answer.
        assert not [r for r in caplog.records if UNSETTLED in r.getMessage()]
        assert not [r for r in caplog.records if "cancellation interrupted" in r.getMessage()]
    finally:
        jq.close()


def test_a_cancel_the_server_does_not_act_on_in_time_says_so(pg_url, caplog, monkeypatch):
    # The cancel request is lost (as to a frozen server): after the bound the
    # connection is closed, and the caller is told the enqueue may commit
    # later -- which it then does, the server never having seen the close.
    monkeypatch.setattr(settling, "CANCEL_SETTLE_TIMEOUT", 0.5)

    async def lost(self: Any, *, timeout: float = 30.0) -> None:
        return None

    monkeypatch.setattr(settling.SettlingConnection, "cancel_safe", lost)
    jq = JobQueue(pg_url)
    jq.migrate()
    seen: list[BaseException] = []

    async def main() -> None:
        await jq.enqueue_async("warm", {})
        async with table_locked(pg_url):
            try:
                await cancelled_twice(jq.enqueue_async("cancelled", {}))
            except asyncio.CancelledError as exc:
                seen.append(exc)
        await asyncio.sleep(0.3)
        await jq.aclose()

    try:
        with caplog.at_level(logging.WARNING, logger="jobkeeper"):
            asyncio.run(main())
        (cancelled,) = seen
        (note,) = getattr(cancelled, "__notes__", [])
        assert "answered neither this enqueue's statement nor its cancel within 0.5 s" in note
        assert UNSETTLED in note
        assert any(note.removeprefix("jobkeeper: ") in r.getMessage() for r in caplog.records)
        assert count(pg_url, where="task = 'cancelled'") == 1  # as the note warned
    finally:
        jq.close()


def test_a_cancel_while_the_connection_goes_back_loses_no_slot(pg_url):
    # putconn waits on the pool's lock (here held by the test, in the storm
    # by the other calls' returns); a second cancel there lost the slot.
    jq = JobQueue(pg_url, pool_size=2)
    jq.migrate()
    backend: Any = jq.backend

    async def sleep_on_the_server() -> None:
        async def sleep(cursor: psycopg.AsyncCursor[Any]) -> None:
            await cursor.execute("SELECT pg_sleep(30)")

        await backend._with_cursor(sleep, transaction=False)

    async def main() -> None:
        await jq.enqueue_async("warm", {})
        (loop_pool,) = backend._async_pools.values()
        pool = loop_pool.pool
        call = asyncio.ensure_future(sleep_on_the_server())
        await asyncio.sleep(0.3)
        async with pool._lock:
            call.cancel()  # the server cancels the sleep; the call gives its connection back
            await asyncio.sleep(0.3)  # ... and waits on the pool's lock
            assert not call.done()
            call.cancel()
            await asyncio.sleep(0.05)
            assert call.done(), "the second cancel did not reach the caller at once"
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.2)  # the return, finished without its caller
        stats = pool.get_stats()
        held = stats["pool_size"] - stats["pool_available"] - (loop_pool.spare is not None)
        assert held == 0, stats
        await asyncio.gather(*(jq.enqueue_async("after", {}) for _ in range(6)))
        await jq.aclose()

    try:
        asyncio.run(asyncio.wait_for(main(), 20))
        assert count(pg_url, where="task = 'after'") == 6
    finally:
        jq.close()


def test_enqueues_under_short_deadlines_leak_no_slot(pg_url):
    # Request deadlines of 0-3 ms over 20 concurrent enqueues: slots leaked
    # round after round (9 of 10 by round 500), then every call failed.
    import random

    jq = JobQueue(pg_url, pool_size=4)
    jq.migrate()
    backend: Any = jq.backend

    async def deadline_call(n: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(random.uniform(0, 0.003)):
                await jq.enqueue_async("deadline", {"n": n})

    async def main() -> None:
        await jq.enqueue_async("warm", {})
        (loop_pool,) = backend._async_pools.values()
        for round_ in range(400):
            await asyncio.gather(*(deadline_call(round_ * 20 + i) for i in range(20)))
        await asyncio.sleep(0.5)
        stats = loop_pool.pool.get_stats()
        held = stats["pool_size"] - stats["pool_available"] - (loop_pool.spare is not None)
        assert held == 0, stats
        await asyncio.wait_for(jq.enqueue_async("after", {}), 5)
        await jq.aclose()

    try:
        asyncio.run(main())
    finally:
        jq.close()


def test_a_cancelled_enqueue_still_settling_when_the_loop_ends_never_commits(pg_url, caplog):
    # Break-test 137: the caller cancelled, and asyncio.run() ended one loop
    # step later, cancelling the settle itself; the connection was closed
    # without the cancel request reaching the server, and the INSERT waiting
    # on the lock committed once the lock was released. asyncio.run() waits
    # for the tasks it cancels: the settle now finishes, bounded.
    jq = JobQueue(pg_url)
    jq.migrate()
    holder = psycopg.connect(pg_url)

    async def main() -> None:
        await jq.enqueue_async("warm", {})
        holder.execute("LOCK TABLE jobkeeper_jobs IN EXCLUSIVE MODE")
        task = asyncio.ensure_future(jq.enqueue_async("cancelled", {}))
        await asyncio.sleep(CANCEL_AFTER)
        task.cancel()
        await asyncio.sleep(0)  # the settle starts; the loop ends with it running

    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(main())
        assert count(pg_url, where="task = 'cancelled'") == 0
        holder.rollback()  # the lock released: a statement left running would commit now
        asyncio.run(asyncio.sleep(0.5))
        assert count(pg_url, where="task = 'cancelled'") == 0
        assert not [r for r in caplog.records if UNSETTLED in r.getMessage()]
    finally:
        holder.close()
        jq.close()
