"""SQLite: a Ctrl-C during a write never leaves the write lock held.

Break-test 15 sent SIGINT every 10-70 ms to a process enqueueing in a loop on
SQLite. One KeyboardInterrupt landed as ``BEGIN IMMEDIATE`` returned, before
the block that rolls back on an error: the connection stayed in a write
transaction, every later call of that process failed ("cannot start a
transaction within a transaction"), and every other process's writes waited
on its lock until it exited (another process's ``jobkeeper enqueue`` gave up
after its 30 s busy timeout).
"""

from __future__ import annotations

from typing import Any

import pytest

from jobkeeper import JobQueue
from support.db import count


@pytest.fixture
def two_queues(sqlite_url: str):
    """The interrupted process's queue and another process's, on one file
    (a short busy timeout: a lock left held fails the other's write fast).
    """
    first = JobQueue(sqlite_url, busy_timeout=0.5)
    first.migrate()
    other = JobQueue(sqlite_url, busy_timeout=0.5)
    yield first, other
    first.close()
    other.close()


def test_a_ctrl_c_as_the_write_lock_is_taken_leaves_no_transaction(two_queues, monkeypatch):
    first, other = two_queues
    first.enqueue("t", {}, external=True)  # the thread's connection, opened
    backend = first.backend
    begin = backend._begin_immediate
    fired: list[int] = []

    def begin_then_interrupted(conn: Any, lock_wait: float | None = None) -> None:
        begin(conn, lock_wait)
        if not fired:
            fired.append(1)
            raise KeyboardInterrupt

    monkeypatch.setattr(backend, "_begin_immediate", begin_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.enqueue("t", {}, external=True)
    assert fired == [1]
    other.enqueue("t", {}, external=True)  # the lock is free
    first.enqueue("t", {}, external=True)  # and the interrupted process carries on
    assert count(first) == 3


def test_a_transaction_left_open_is_closed_with_its_connection(two_queues):
    # The safety net behind the rollback: a second Ctrl-C during that
    # ROLLBACK left the transaction open too.
    first, other = two_queues
    first.enqueue("t", {}, external=True)
    backend = first.backend
    with backend._errors():
        backend._conn().execute("BEGIN IMMEDIATE")
    other.enqueue("t", {}, external=True)
    first.enqueue("t", {}, external=True)
    assert count(first) == 3
