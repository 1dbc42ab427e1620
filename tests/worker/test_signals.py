"""SIGTERM and SIGINT are handled off the main thread: a Python signal handler
runs on the main thread between two bytecodes, possibly inside
``threading.Event.wait`` with the event's lock held (the producer's wait), so
a handler that set that event there waited for its own lock forever (a worker
hung at SIGTERM in a clean-clone run).
"""

from __future__ import annotations

import os
import signal
import threading

from jobkeeper.worker.listener import SignalRelay
from support.waiting import DEADLINE


def test_a_signal_that_lands_while_this_thread_holds_the_events_lock_is_handled_after():
    stopped = threading.Event()
    seen: list[int] = []

    def handler(signum: int, frame: object) -> None:
        seen.append(signum)
        stopped.set()  # what Worker.stop does to the producer's wake event

    before = signal.getsignal(signal.SIGTERM)
    relay = SignalRelay(handler)
    relay.install()
    try:
        with stopped._cond:  # type: ignore[attr-defined]  # as inside Event.wait
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # bytecodes: the Python-level handler runs among them
                pass
            assert not stopped.is_set()
        assert stopped.wait(DEADLINE)
        assert seen == [signal.SIGTERM]
    finally:
        relay.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_signals_are_relayed_in_order_and_restore_ends_the_relay():
    seen: list[int] = []
    both = threading.Event()

    def handler(signum: int, frame: object) -> None:
        seen.append(signum)
        if len(seen) == 2:
            both.set()

    relay = SignalRelay(handler)
    relay.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert both.wait(DEADLINE)
    finally:
        relay.restore()
    assert seen == [signal.SIGINT, signal.SIGTERM]
    assert not any(t.name == "jobkeeper-signals" for t in threading.enumerate())
