"""The async API's threads and connections across ``fork``, ``aclose()``
and ``close()`` (found by a break-test, helper-116):

- SQLite's async calls run on a thread pool; a child forked after the
  parent had used it got the pool without its threads, and every async call
  of the child waited for good (the pool counted the parent's idle threads).
- ``aclose()`` in one thread stopped the pool other threads' loops were
  sending calls to: they failed with a bare ``RuntimeError: cannot schedule
  new futures after shutdown``.
- The wait's LISTEN (or data_version) connection stayed open for
  ``IDLE_STOP`` (5 s) after ``close()``, which says it closes the queue's
  connections.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from jobkeeper import JobQueue
from jobkeeper.errors import DatabaseUnavailable

FORK_AFTER_ASYNC = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from jobkeeper import JobQueue

    jq = JobQueue(sys.argv[1], external_tasks=True)
    jq.migrate()
    asyncio.run(jq.enqueue_async("f", {"who": "parent"}))  # the parent's async threads

    async def child_calls():
        job = await jq.enqueue_async("f", {"who": os.getpid()})
        return (await jq.get_job_async(job.id)).status

    kids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                print("child", asyncio.run(child_calls()), flush=True)
            finally:
                os._exit(0)
        kids.append(pid)
    deadline = time.monotonic() + 20
    for pid in kids:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                print("child hung", flush=True)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)
    asyncio.run(jq.enqueue_async("f", {"who": "parent again"}))
    print("parent ok", flush=True)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_sqlite_async_calls_in_a_child_forked_after_async_use(sqlite_url: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_ASYNC, sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["child available"] * 2 + ["parent ok"], run.stdout


def test_sqlite_call_sent_while_another_thread_acloses(sqlite_url: str) -> None:
    """Deterministic: the pool is stopped between a call's look-up of it and
    its submit. Then a later call works again."""
    jq = JobQueue(sqlite_url, external_tasks=True)
    jq.migrate()
    backend = jq.backend
    real = backend._executor  # type: ignore[attr-defined]

    def looked_up_then_stopped():  # type: ignore[no-untyped-def]
        executor = real()
        closer = threading.Thread(target=lambda: asyncio.run(backend.aclose()))
        closer.start()
        closer.join()
        return executor

    backend._executor = looked_up_then_stopped  # type: ignore[attr-defined]
    with pytest.raises(DatabaseUnavailable, match=r"were stopped \(JobQueue.close\(\) or aclose"):
        asyncio.run(jq.enqueue_async("t", {}))
    del backend._executor  # type: ignore[attr-defined]
    job = asyncio.run(jq.enqueue_async("t", {}))
    assert asyncio.run(jq.get_job_async(job.id)) is not None
    jq.close()


def test_sqlite_aclose_in_a_loop_while_threads_enqueue(sqlite_url: str) -> None:
    """The break-test's shape, short (timing-dependent: the deterministic
    test is above): only jobkeeper's errors, never a bare RuntimeError."""
    jq = JobQueue(sqlite_url, external_tasks=True)
    jq.migrate()
    seen: Counter[str] = Counter()
    stop = threading.Event()

    def producer() -> None:
        for i in range(100):
            try:
                job = asyncio.run(jq.enqueue_async("t", {"i": i}))
                asyncio.run(jq.get_job_async(job.id))
                seen["ok"] += 1
            except DatabaseUnavailable:
                seen["DatabaseUnavailable"] += 1
            except Exception as exc:
                seen[f"{type(exc).__name__}: {exc}"] += 1

    def closer() -> None:
        while not stop.is_set():
            asyncio.run(jq.aclose())

    closing = threading.Thread(target=closer)
    closing.start()
    producers = [threading.Thread(target=producer) for _ in range(4)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    stop.set()
    closing.join()
    jq.close()
    assert set(seen) <= {"ok", "DatabaseUnavailable"}, seen
    assert seen["ok"] > 0


def test_close_stops_the_wait_connection(make_queue: Callable[..., JobQueue]) -> None:
    jq = make_queue(external_tasks=True)
    job = jq.enqueue("never_run", {})
    with pytest.raises(TimeoutError):
        jq.wait(job.id, timeout=0.3)
    watcher = jq.backend.completion_watch()._thread  # type: ignore[attr-defined]
    assert watcher is not None and watcher.is_alive()
    jq.close()
    watcher.join(2.0)  # IDLE_STOP is 5 s: it would still be there
    assert not watcher.is_alive()


def test_close_keeps_the_wait_connection_of_a_wait_in_flight(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Another thread's wait (or another queue's, on this database) goes on."""
    jq = make_queue(external_tasks=True)
    job = jq.enqueue("never_run", {})
    outcome: list[BaseException] = []

    def waiter() -> None:
        try:
            jq.wait(job.id, timeout=10.0)
        except BaseException as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=waiter)
    waiting.start()
    watch = jq.backend.completion_watch()
    for _ in range(200):
        if watch.waiting_ids():
            break
        threading.Event().wait(0.01)
    watcher = watch._thread  # type: ignore[attr-defined]
    jq.close()
    watcher.join(1.0)
    assert watcher.is_alive()
    jq.cancel(job.id)
    waiting.join(10)
    assert outcome and type(outcome[0]).__name__ == "JobCancelled", outcome
