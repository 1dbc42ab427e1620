"""A bulk enqueue interrupted just as PostgreSQL starts its COPY (a Ctrl-C,
an asyncio cancellation such as ``wait_for``'s timeout).

psycopg answers an interruption during a wait by cancelling the statement
and finishing the wait; when the server had already started the COPY, the
connection is left in COPY FROM STDIN mode with no Copy object to end it.
The transaction's rollback then failed ("another command is already in
progress") and the pool threw the connection away, three warnings per
interrupted call (break-test 4 saw them in about half of its cancelled
``enqueue_many_async`` calls). The moment is a few microseconds wide, so
these tests put the interruption there: right after the wait that started
the COPY returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.postgres.settling import SettlingConnection
from support.db import count
from support.settings import FAST

BATCH = 200  # past COPY_MIN_JOBS: the COPY path


class _Interrupt:
    """Raise ``error`` once, right after the next COPY's start was waited for."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.armed = False
        self.fired = 0


@pytest.fixture
def interrupt_after_copy_start(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[BaseException], _Interrupt]]:
    holder: list[_Interrupt] = []
    copy_gens: set[int] = set()

    def marked(cls: type) -> Any:
        original = cls._start_copy_gen

        def start_copy_gen(self: Any, *args: Any, **kwargs: Any) -> Any:
            gen = original(self, *args, **kwargs)
            copy_gens.add(id(gen))
            return gen

        return start_copy_gen

    def should_fire(gen: Any) -> bool:
        if id(gen) not in copy_gens:
            return False
        copy_gens.discard(id(gen))
        return bool(holder) and holder[0].armed

    def fire() -> None:
        interrupt = holder[0]
        interrupt.armed = False
        interrupt.fired += 1
        raise interrupt.error

    sync_wait = psycopg.Connection.wait
    # The async pools' connections wait through their own class's wait.
    async_wait = SettlingConnection.wait

    def wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        interrupted = should_fire(gen)
        result = sync_wait(self, gen, *args, **kwargs)
        if interrupted:
            fire()
        return result

    async def wait_async(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        interrupted = should_fire(gen)
        result = await async_wait(self, gen, *args, **kwargs)
        if interrupted:
            fire()
        return result

    monkeypatch.setattr(psycopg.Cursor, "_start_copy_gen", marked(psycopg.Cursor))
    monkeypatch.setattr(psycopg.AsyncCursor, "_start_copy_gen", marked(psycopg.AsyncCursor))
    monkeypatch.setattr(psycopg.Connection, "wait", wait)
    monkeypatch.setattr(SettlingConnection, "wait", wait_async)

    def arm(error: BaseException) -> _Interrupt:
        holder[:] = [_Interrupt(error)]
        holder[0].armed = True
        return holder[0]

    yield arm


def _psycopg_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("psycopg") and record.levelno >= logging.WARNING
    ]


def _queue(pg_url: str, **settings: Any) -> JobQueue:
    """A migrated queue registering ``t(i)``, the task of :data:`ITEMS`."""
    jq = JobQueue(pg_url, **{**FAST, **settings})
    jq.migrate()

    @jq.task
    def t(i: int) -> None:
        return None

    return jq


ITEMS = [("t", {"i": i}) for i in range(BATCH)]


def _interrupted_then_usable(jq: JobQueue, caplog: pytest.LogCaptureFixture) -> None:
    """A sync ``enqueue_many`` that the armed interruption stops writes
    nothing and warns nothing, and the next one on the same (only)
    connection works.
    """
    caplog.set_level(logging.WARNING)
    with pytest.raises(KeyboardInterrupt):
        jq.enqueue_many(ITEMS)
    assert _psycopg_warnings(caplog) == []
    assert count(jq) == 0
    assert len(jq.enqueue_many(ITEMS)) == BATCH
    assert count(jq) == BATCH


def test_a_ctrl_c_as_the_copy_starts_leaves_the_connection_usable(
    pg_url, interrupt_after_copy_start, caplog
):
    jq = _queue(pg_url, pool_size=1)
    try:
        interrupt = interrupt_after_copy_start(KeyboardInterrupt())
        _interrupted_then_usable(jq, caplog)
        assert interrupt.fired == 1
    finally:
        jq.close()


def test_a_cancel_as_the_copy_starts_leaves_the_connection_usable(
    pg_url, interrupt_after_copy_start, caplog
):
    jq = _queue(pg_url)

    async def main() -> None:
        try:
            await jq.enqueue_many_async(ITEMS[:1])  # the loop's pool, opened
            interrupt = interrupt_after_copy_start(asyncio.CancelledError())
            caplog.set_level(logging.WARNING)
            with pytest.raises(asyncio.CancelledError):
                await jq.enqueue_many_async(ITEMS)
            assert interrupt.fired == 1
            assert _psycopg_warnings(caplog) == []
            assert len(await jq.enqueue_many_async(ITEMS)) == BATCH
        finally:
            await jq.aclose()

    try:
        asyncio.run(main())
        assert count(jq) == 1 + BATCH
    finally:
        jq.close()


def test_a_ctrl_c_after_the_copy_end_was_sent_leaves_the_connection_usable(
    pg_url, monkeypatch, caplog
):
    """The interruption lands once the COPY's end is sent, while its reply
    is awaited (break-test 14 saw Ctrl-C storms land there, and after a
    statement was sent): the reply is read before the rollback.
    """
    import psycopg._copy
    from psycopg.waiting import Wait

    original = psycopg._copy.copy_end
    fired: list[int] = []

    def copy_end(pgconn: Any, error: Any) -> Any:
        gen = original(pgconn, error)
        ready = None
        while True:
            try:
                wait = gen.send(ready) if ready is not None else next(gen)
            except StopIteration as stop:
                return stop.value
            if wait == Wait.R and not fired:
                fired.append(1)
                raise KeyboardInterrupt
            ready = yield wait

    monkeypatch.setattr(psycopg._copy, "copy_end", copy_end)
    jq = _queue(pg_url, pool_size=1)
    try:
        _interrupted_then_usable(jq, caplog)
        assert fired == [1]
    finally:
        jq.close()


@pytest.mark.parametrize("error", [KeyboardInterrupt(), asyncio.CancelledError()])
def test_an_interruption_while_the_ids_are_reserved_leaves_the_connection_usable(
    pg_url, caplog, error
):
    """The COPY path validates its items while the id reservation runs, sent
    in pipeline mode: an interruption there (in a task's validation, a
    Ctrl-C) leaves that statement's reply unread. The batch writes nothing,
    nothing warns, and the next batch on the same (only) connection works.
    """
    from jobkeeper.models import NewJobStream

    jq = _queue(pg_url, pool_size=1)
    try:
        caplog.set_level(logging.WARNING)
        stream = jq._new_jobs(ITEMS)
        assert isinstance(stream, NewJobStream)
        read = stream._read

        def interrupted(items: list[object], start: int, stop: int, *columns: list[object]) -> None:
            if start <= BATCH // 2 < stop:
                read(items, start, BATCH // 2, *columns)
                raise error
            read(items, start, stop, *columns)

        stream._read = interrupted
        with pytest.raises(type(error)):
            jq.backend.job_insert_many(jobs=stream)
        assert _psycopg_warnings(caplog) == []
        assert count(jq) == 0
        assert len(jq.enqueue_many(ITEMS)) == BATCH
        assert count(jq) == BATCH
    finally:
        jq.close()


def test_a_cancel_while_the_ids_are_reserved_async_leaves_the_connection_usable(pg_url, caplog):
    """The same on the async API (its pool, its pipeline)."""
    from jobkeeper.models import NewJobStream

    jq = _queue(pg_url, pool_size=1)

    async def main() -> None:
        stream = jq._new_jobs(ITEMS)
        assert isinstance(stream, NewJobStream)
        read = stream._read

        def interrupted(items: list[object], start: int, stop: int, *columns: list[object]) -> None:
            if start <= BATCH // 2 < stop:
                read(items, start, BATCH // 2, *columns)
                raise asyncio.CancelledError()
            read(items, start, stop, *columns)

        stream._read = interrupted
        with pytest.raises(asyncio.CancelledError):
            await jq.backend.job_insert_many_async(jobs=stream)
        assert len(await jq.enqueue_many_async(ITEMS)) == BATCH
        await jq.aclose()

    try:
        caplog.set_level(logging.WARNING)
        asyncio.run(main())
        assert _psycopg_warnings(caplog) == []
        assert count(jq) == BATCH
    finally:
        jq.close()
