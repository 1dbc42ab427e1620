"""SQLite: a claim commits without waiting for its fsync, every other
write with it (issue 18's enqueue->start latency: one fsync fewer on the
way). The connection is back to ``synchronous=FULL`` after a claim, even
one that fails, so the outcome written next on it is synced, and with it
the claim's frames before it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.sqlite.backend import SqliteBackend

FULL, NORMAL = 2, 1


def synchronous(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


@pytest.fixture
def jq(sqlite_url: str):
    queue = JobQueue(sqlite_url)
    queue.migrate()
    yield queue
    queue.close()


def test_only_the_claim_skips_the_fsync(jq, monkeypatch):
    backend = jq.backend
    assert isinstance(backend, SqliteBackend)
    seen: list[int] = []
    picked = SqliteBackend._claim_picked

    def watching(self: Any, conn: sqlite3.Connection, *args: Any) -> Any:
        seen.append(synchronous(conn))
        return picked(self, conn, *args)

    monkeypatch.setattr(SqliteBackend, "_claim_picked", watching)
    jq.enqueue("t", {})
    conn = backend._conn()
    assert synchronous(conn) == FULL  # the enqueue
    assert len(backend.job_claim(worker_id="w", queue="default", limit=5)) == 1
    assert seen == [NORMAL]
    assert synchronous(conn) == FULL  # back for the outcome
    jq.configure_queue("default", concurrency=3)  # the limited claim, same transaction
    jq.enqueue("t", {})
    assert len(backend.job_claim(worker_id="w", queue="default", limit=5)) == 1
    assert synchronous(conn) == FULL


def test_a_claim_that_fails_still_restores_the_fsync(jq, monkeypatch):
    backend = jq.backend
    jq.enqueue("t", {})

    def failing(self: Any, conn: sqlite3.Connection, *args: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(SqliteBackend, "_claim_picked", failing)
    with pytest.raises(Exception, match="disk I/O error"):
        backend.job_claim(worker_id="w", queue="default", limit=5)
    conn = backend._conn()
    assert synchronous(conn) == FULL
    assert not conn.in_transaction
    monkeypatch.undo()
    assert len(backend.job_claim(worker_id="w", queue="default", limit=5)) == 1
