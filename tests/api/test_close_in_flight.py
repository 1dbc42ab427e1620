"""``JobQueue.close()`` and ``aclose()`` while other threads or tasks are
using the queue: the calls in flight finish or fail with jobkeeper's errors,
nothing is half written, the process lives, and a wait goes on.

Found by a break-test: on SQLite, close() closed the connections other
threads were running statements on (the process died of SIGSEGV in 5 of 5
runs); on PostgreSQL a wait() cut by close() waited out the closed pool for
ever, though the job had completed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from jobkeeper import JobQueue

CLOSE_WHILE_WRITING = textwrap.dedent(
    """
    import asyncio, sys, threading, time
    from jobkeeper import JobQueue
    from jobkeeper.errors import JobkeeperError

    jq = JobQueue(sys.argv[1])
    jq.migrate()
    stored, unexpected = [], []

    def producer():
        for n in range(150):
            try:
                stored.append(len(jq.enqueue_many([("t", {"i": n})] * 20)))
            except JobkeeperError:
                pass
            except BaseException as exc:
                unexpected.append(repr(exc))

    async def async_producers():
        async def one(k):
            try:
                return len(await jq.enqueue_many_async([("t", {"i": k})] * 20))
            except JobkeeperError:
                return 0
        tasks = [asyncio.ensure_future(one(k)) for k in range(30)]
        await asyncio.sleep(0.01)
        await jq.aclose()
        stored.extend(await asyncio.gather(*tasks))

    threads = [threading.Thread(target=producer) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    jq.close()
    for thread in threads:
        thread.join()
    asyncio.run(async_producers())
    jq.close()
    rows = sum(jq.queue_counts().counts.get("default", {}).values())
    print(sum(stored), rows, unexpected)
    """
)


def test_closing_while_other_threads_and_tasks_write(db_url: str, tmp_path: Any) -> None:
    script = tmp_path / "close_while_writing.py"
    script.write_text(CLOSE_WHILE_WRITING)
    run = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(script), db_url],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    stored, rows, unexpected = run.stdout.split(maxsplit=2)
    assert unexpected.strip() == "[]"
    # Every batch whose call returned is there, and no other: none half written.
    assert int(stored) == int(rows) > 0


@pytest.fixture
def adder(make_queue: Any) -> tuple[JobQueue, Any]:
    jq = make_queue()

    @jq.task()
    def add(a: int, b: int) -> int:
        return a + b

    return jq, add


def test_a_wait_cut_by_close_goes_on(adder: tuple[JobQueue, Any]) -> None:
    jq, add = adder
    job = add.enqueue(a=1, b=2)
    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(jq.wait(job.id, timeout=60)))
    waiter.start()
    time.sleep(0.5)  # the waiter listens
    jq.close()
    jq.run_worker(queues=["default"], burst=True)
    waiter.join(30)
    assert not waiter.is_alive(), "wait() still blocked after close()"
    assert results == [3]


def test_a_wait_async_cut_by_aclose_on_another_loop_goes_on(adder: tuple[JobQueue, Any]) -> None:
    jq, add = adder
    job = add.enqueue(a=2, b=3)
    results: list[Any] = []

    def wait_on_its_own_loop() -> None:
        results.append(asyncio.run(jq.wait_async(job.id, timeout=60)))

    waiter = threading.Thread(target=wait_on_its_own_loop)
    waiter.start()
    time.sleep(0.5)
    asyncio.run(jq.aclose())
    jq.run_worker(queues=["default"], burst=True)
    waiter.join(30)
    assert not waiter.is_alive(), "wait_async() still blocked after aclose()"
    assert results == [5]


def test_a_wait_async_across_aclose_leaves_no_pool_on_the_closed_backend(
    adder: tuple[JobQueue, Any],
) -> None:
    # Break-test 137: the wait's next read ran on the backend aclose() had
    # closed and the queue forgotten; on PostgreSQL that opened a new pool
    # of the loop on it, which nothing closed (3 sessions left until the
    # loop ended). Reads go to the queue's current backend instead.
    jq, add = adder
    job = add.enqueue(a=1, b=1)  # no worker: it never ends

    async def main() -> Any:
        waiting = asyncio.ensure_future(jq.wait_async(job.id, timeout=2))
        await asyncio.sleep(0.5)  # the waiter listens, its first read done
        old = jq.backend
        await jq.aclose()
        with pytest.raises(TimeoutError):
            await waiting
        pools = getattr(old, "_async_pools", {})
        assert not [p for p in pools.values() if not p.closed], "a pool opened on the old backend"
        await jq.aclose()

    asyncio.run(main())


def test_a_wait_cut_by_close_keeps_its_timeout(adder: tuple[JobQueue, Any]) -> None:
    jq, add = adder
    job = add.enqueue(a=1, b=1)  # no worker: it never ends
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            jq.wait(job.id, timeout=3)
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    jq.close()
    waiter.join(30)
    took = time.monotonic() - started
    assert [type(e) for e in errors] == [TimeoutError]
    assert "within 3s" in str(errors[0])
    assert took < 20  # counted from the call, not restarted by close()


def test_a_cancelled_enqueue_async_is_settled_when_the_caller_sees_the_cancel(
    make_queue: Any,
) -> None:
    # Found by a break-test: on SQLite the write of a cancelled call ran on
    # in its thread and committed afterwards, even after asyncio.run() had
    # returned (jobs right after the TimeoutError: 3, 0.2 s later: 4): a
    # caller that looked, found nothing and enqueued again had it twice.
    jq = make_queue()

    async def main() -> list[tuple[int, int]]:
        await jq.enqueue_async("t", {"i": 0})
        counts = []
        for i in range(1, 150):
            try:
                await asyncio.wait_for(jq.enqueue_many_async([("t", {"i": i})] * 5), 0.0005)
            except TimeoutError:
                right_after = len(jq.list_jobs(task="t", limit=1000))
                await asyncio.sleep(0.05)
                counts.append((right_after, len(jq.list_jobs(task="t", limit=1000))))
        return counts

    counts = asyncio.run(main())
    assert counts, "no call was cut short: the test proves nothing"
    assert all(now == later for now, later in counts), counts
    # Whole batches only.
    assert all(now % 5 == 1 for now, _ in counts), counts


def test_a_ctrl_c_during_close_leaves_a_queue_that_reconnects(jq: JobQueue) -> None:
    # close() closed the backend, then forgot it: a KeyboardInterrupt between
    # the two kept the closed backend, and every later call was refused as
    # "the pool was closed" (helper-55: 5 of 60 interrupted closes).
    jq.enqueue("t", {})
    backend = jq.backend
    real_close = backend.close

    def interrupted_close() -> None:
        real_close()
        raise KeyboardInterrupt

    backend.close = interrupted_close  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        jq.close()
    assert jq.backend is not backend
    jq.enqueue("t", {})
    assert len(jq.list_jobs(limit=10)) == 2
