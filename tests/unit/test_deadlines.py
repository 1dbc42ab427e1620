"""The executor's deadline watch keeps nothing of unwatched keys for long."""

from __future__ import annotations

import threading
import time

from jobkeeper.worker.deadlines import COMPACT_FLOOR, DeadlineWatch


def test_unwatched_keys_are_compacted_away_and_never_called_back():
    called: list[int] = []
    watch = DeadlineWatch(called.append, "test-deadlines")
    try:
        far = time.monotonic() + 3600
        for key in range(10_000):
            watch.watch(key, far)
            watch.unwatch(key)
        assert len(watch) <= COMPACT_FLOOR + 1
        watch.watch(1, far)
        for key in range(2, 1000):
            watch.watch(key, far)
        assert len(watch) <= 2 * 1000 + COMPACT_FLOOR
    finally:
        watch.close()
    assert called == []


def test_a_passed_deadline_calls_back_once_and_a_rewatch_replaces_it():
    fired = threading.Event()
    called: list[int] = []

    def on_deadline(key: int) -> None:
        called.append(key)
        fired.set()

    watch = DeadlineWatch(on_deadline, "test-deadlines")
    try:
        soon = time.monotonic() + 0.05
        watch.watch(7, soon)
        watch.watch(7, soon + 3600)  # replaces the first watch
        watch.watch(8, soon)
        assert fired.wait(10)
        time.sleep(0.1)
    finally:
        watch.close()
    assert called == [8]
