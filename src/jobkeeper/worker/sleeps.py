"""``time.sleep`` that an interrupt ends, inside sync tasks.

An interrupt is an exception injected into the task's thread, raised at its
next Python bytecode. A thread asleep in ``time.sleep`` runs none until the
sleep returns: signals wake only the main thread, and CPython's sleep, woken
on another thread, sleeps on for what is left. So a task sleeping 60 s kept
its job held through a timeout, a cancel and a stop: at shutdown it was not
handed back, and the worker exited 1 with the job left to a rescue
(pgqueuer#630 is the same failure in another queue).

A worker therefore puts :func:`interruptible_sleep` in place of
``time.sleep``. Outside a task it is the original; inside one it waits on a
lock the interrupt releases, so the sleep ends early and the injected
exception is raised right after. Code that bound ``sleep`` before the worker
started (``from time import sleep`` at import time) and other C calls (a
socket read, ``select``) are still out of an interrupt's reach; their job
stays held until they return (see :mod:`jobkeeper.worker.executor`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import SupportsIndex

_original_sleep = time.sleep
_install_lock = threading.Lock()
#: Runner thread ident -> the lock its task's sleeps wait on, while that
#: thread runs task code. Held until an interrupt releases it.
_wakes: dict[int, threading.Lock] = {}


def install() -> None:
    """Put :func:`interruptible_sleep` in place of ``time.sleep`` (once per
    process; it stays, being the original outside tasks).
    """
    with _install_lock:
        if time.sleep is not interruptible_sleep:
            time.sleep = interruptible_sleep


def interruptible_sleep(seconds: float | SupportsIndex, /) -> None:
    """``time.sleep(seconds)``, ended early by an interrupt of the task
    running on this thread (which then raises the interrupt's exception).

    Args:
        seconds: how long to sleep; anything ``time.sleep`` takes.

    Raises:
        ValueError, TypeError, OverflowError: as ``time.sleep`` does.
    """
    wake = _wakes.get(threading.get_ident())
    if (
        wake is None
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= threading.TIMEOUT_MAX
    ):
        # Outside a task, and what time.sleep refuses or does at once.
        _original_sleep(seconds)
        return
    # Acquired only when woken: the interrupt's exception, already injected,
    # is raised at the next bytecode. The wake is spent: later sleeps sleep
    # in full.
    wake.acquire(timeout=seconds)


def enter(thread_id: int) -> threading.Lock:
    """Task code starts on thread ``thread_id``: its sleeps become
    interruptible. Returns the handle :func:`wake` takes.
    """
    wake = threading.Lock()
    wake.acquire()
    _wakes[thread_id] = wake
    return wake


def leave(thread_id: int) -> None:
    """Task code on ``thread_id`` has returned."""
    _wakes.pop(thread_id, None)


def wake(handle: threading.Lock) -> None:
    """End the sleep (current or next) of the task holding ``handle``."""
    with contextlib.suppress(RuntimeError):  # already woken
        handle.release()
