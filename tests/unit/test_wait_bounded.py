"""A wait with a timeout returns when its database hangs (found by a
break-test, helper-85: a PostgreSQL server frozen by SIGSTOP accepts and
never answers; 50 ``wait_async`` calls with ``timeout=6`` had not returned
after 10 minutes, and sync waits returned only when the server woke). Each
database step of the wait gets what is left of the timeout (at least
``LEAST_CALL``), then the wait raises ``DatabaseUnavailable``.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from jobkeeper.api.results import _drive_wait, _drive_wait_async
from jobkeeper.backends.watch import CompletionWatch
from jobkeeper.database_url import DatabaseURL
from jobkeeper.errors import DatabaseUnavailable


class _Unwatched:
    def run(self, watch: CompletionWatch) -> None:
        watch.set_unwatched()
        while not watch.should_stop():
            threading.Event().wait(0.05)


class _HungDatabase:
    """A backend whose server accepted the connection and never answers."""

    url = DatabaseURL("postgresql", "postgresql://db.test/jobs")

    def __init__(self) -> None:
        self.released = threading.Event()
        self._watch = CompletionWatch(_Unwatched, "hung")

    def completion_watch(self) -> CompletionWatch:
        return self._watch

    def job_mark_awaited(self, *, job_id: int) -> None:
        self.released.wait(60)

    def job_get(self, *, job_id: int) -> None:
        self.released.wait(60)

    async def job_mark_awaited_async(self, *, job_id: int) -> None:
        await asyncio.sleep(60)

    async def job_get_async(self, *, job_id: int) -> None:
        await asyncio.sleep(60)


def _ends(run, limit: float = 20.0) -> BaseException | None:
    """What ``run()`` raised, asserting it ended within ``limit`` seconds
    (a liveness bound, far above the 1 s the wait may take)."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), "the wait did not return while its database hung"
    return raised[0] if raised else None


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_wait_with_a_timeout_returns_while_its_database_hangs(flavour):
    backend = _HungDatabase()
    try:
        if flavour == "sync":
            raised = _ends(lambda: _drive_wait(backend, 1, 0.2, 0.05))  # type: ignore[arg-type]
        else:
            raised = _ends(lambda: asyncio.run(_drive_wait_async(backend, 1, 0.2, 0.05)))  # type: ignore[arg-type]
    finally:
        backend.released.set()
    assert isinstance(raised, DatabaseUnavailable), raised
    assert "did not answer" in str(raised)


def test_a_sqlite_wait_reads_on_its_own_thread(sqlite_url):
    # A bounded read runs on a thread of its own; on SQLite (a file: it
    # cannot hang) that would open a connection per read, so it does not.
    from jobkeeper import JobQueue

    with JobQueue(sqlite_url) as jq:
        jq.migrate()
        job = jq.enqueue("t", {})
        before = threading.active_count()
        for _ in range(5):
            with pytest.raises(TimeoutError):
                jq.wait(job.id, timeout=0.01)
        assert not [t for t in threading.enumerate() if t.name == "jobkeeper-wait-call"]
        assert threading.active_count() <= before + 1  # the watch's thread
