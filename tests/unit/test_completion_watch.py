"""The completion watch's readiness, as async waiters see it: they hold no
thread while the source has not said whether it watches (found by a
break-test, helper-82: 50 ``wait_async`` calls started while PostgreSQL was
down held the loop's default executor and returned in batches, up to 9x past
their timeout, stalling every ``to_thread`` of the application).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from jobkeeper.backends.watch import CompletionWatch


class _Undecided:
    """A source that cannot say yet (its database is down) until told."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.watching = True

    def run(self, watch: CompletionWatch) -> None:
        self.go.wait(30)
        if self.watching:
            watch.set_ready(True)
        else:
            watch.set_unwatched()
        while not watch.should_stop():
            self.go.wait(0.05)
        watch.set_ready(False)


class _NoThreads(concurrent.futures.ThreadPoolExecutor):
    def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("an async waiter took an executor thread")


def _wait_all(watch: CompletionWatch, count: int, timeout: float) -> list[bool]:
    async def main() -> list[bool]:
        asyncio.get_running_loop().set_default_executor(_NoThreads(max_workers=1))
        return list(await asyncio.gather(*(watch.wait_ready_async(timeout) for _ in range(count))))

    return asyncio.run(main())


def test_async_waiters_for_an_undecided_watch_hold_no_thread_and_time_out():
    source = _Undecided()
    watch = CompletionWatch(lambda: source, "test")
    unregister = watch.register(1, lambda: None)
    try:
        assert _wait_all(watch, 50, 0.2) == [False] * 50
    finally:
        unregister()
        source.go.set()


def test_async_waiters_wake_when_the_watch_decides():
    for watching in (True, False):
        source = _Undecided()
        source.watching = watching
        watch = CompletionWatch(lambda s=source: s, "test")
        unregister = watch.register(1, lambda: None)
        threading.Timer(0.1, source.go.set).start()
        try:
            # Woken by the decision, long before the 30 s timeout.
            assert _wait_all(watch, 20, 30.0) == [watching] * 20
        finally:
            unregister()
