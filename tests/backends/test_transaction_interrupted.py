"""A Ctrl-C that lands as psycopg enters a transaction block.

psycopg 3.3's ``Transaction.__enter__`` undoes an interrupted entry by
leaving the block, counted in or not. Interrupted as its wait begins, before
the block is counted, it takes the connection's count of open blocks to -1
while the server stays idle; the pool kept the connection and every later
transaction on it failed ("transaction rollback at the wrong nesting
level"). A SIGINT storm on ``enqueue_many`` left 3,334 and 3,911 failed calls
behind it in two of four one-minute runs. These tests put the interruption
in that window. (The async entry cannot be cancelled there: psycopg starts
its generator before the first suspension point.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.postgres.single import SingleConnection
from support.db import count
from support.settings import FAST

BATCH = 200  # enough for the bulk path's transaction block


@pytest.fixture
def interrupt_transaction_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[], list[int]]]:
    """Arm a KeyboardInterrupt for the next ``conn.transaction()`` entry,
    raised where psycopg's wait starts, before the entry's generator runs.
    """
    armed: list[bool] = []
    fired: list[int] = []
    sync_wait = psycopg.Connection.wait

    def wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if armed and getattr(gen, "__name__", "") == "_enter_gen":
            armed.clear()
            fired.append(1)
            gen.close()
            raise KeyboardInterrupt
        return sync_wait(self, gen, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "wait", wait)

    def arm() -> list[int]:
        armed.append(True)
        return fired

    yield arm


def test_a_ctrl_c_entering_the_transaction_costs_one_call_only(
    pg_url: str, interrupt_transaction_entry: Callable[[], list[int]]
) -> None:
    jq = JobQueue(pg_url, **{**FAST, "pool_size": 1})
    jq.migrate()

    @jq.task
    def t(i: int) -> None:
        return None

    items = [("t", {"i": i}) for i in range(BATCH)]
    try:
        jq.enqueue_many(items)  # the pool's one connection, opened and used
        fired = interrupt_transaction_entry()
        with pytest.raises(KeyboardInterrupt):
            jq.enqueue_many(items)
        assert fired == [1]
        for _ in range(3):
            assert len(jq.enqueue_many(items)) == BATCH
        assert count(jq) == 4 * BATCH
    finally:
        jq.close()


def test_a_worker_connection_is_reopened_after_the_same_interruption(
    pg_url: str, interrupt_transaction_entry: Callable[[], list[int]]
) -> None:
    source = SingleConnection(pg_url)
    try:
        with source.connection() as conn:
            first = conn
        fired = interrupt_transaction_entry()
        with pytest.raises(KeyboardInterrupt), source.connection() as conn, conn.transaction():
            pass
        assert fired == [1]
        with source.connection() as conn, conn.transaction():
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn is not first  # the unsound session was dropped
    finally:
        source.close()
