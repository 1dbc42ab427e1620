"""The end of verify's fault phase: the feeder is stopped while the fleet
keeps ticking, so that a worker still SIGSTOPped (on SQLite, holding the
write lock the feeder's last enqueue waits for) gets its SIGCONT."""

from __future__ import annotations

import threading
import time

from jobkeeper.verify.run import stop_feeding


def test_the_fleet_ticks_while_the_feeder_finishes():
    stop = threading.Event()
    resumed = threading.Event()  # the paused worker's SIGCONT, sent by a tick
    waited: list[bool] = []

    def feeder() -> None:
        stop.wait()
        # The last enqueue: blocked until the paused worker is resumed (its
        # busy_timeout, here 10 s, would otherwise end the wait with an error).
        waited.append(resumed.wait(10))

    thread = threading.Thread(target=feeder, daemon=True)
    thread.start()
    due = time.monotonic() + 0.3  # the SIGCONT falls due after the phase ended

    def tick() -> None:
        if time.monotonic() >= due:
            resumed.set()

    started = time.monotonic()
    stop_feeding(thread, stop, tick, timeout=30)
    assert not thread.is_alive()
    assert waited == [True], "the feeder's enqueue timed out: nobody resumed the worker"
    assert time.monotonic() - started < 5
