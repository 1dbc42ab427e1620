"""Closing the sync pools a script left open, at interpreter exit (internal).

psycopg_pool's ``ConnectionPool.__del__`` stops its worker threads and
joins each for up to 5 seconds. On Python 3.13 a pool still open when the
interpreter finalizes is collected after its daemon threads were frozen:
every join waits out its timeout, and a script that enqueued one job and
never called ``JobQueue.close()`` took about 20 s to exit (3 workers and
the scheduler; 0.4 s on 3.12). psycopg_pool's warning about it ("couldn't
stop thread ... within 5.0 seconds") goes to the ``psycopg.pool`` logger,
which ``sources`` gives a NullHandler, so the wait was silent. An
``atexit`` hook runs before finalization, while those threads still run,
and closes the pools in a few milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from typing import Protocol


class Releasable(Protocol):
    def release(self) -> None: ...


# Each open source and the process that opened it. Weak: a source closed,
# or collected with its queue, drops out by itself.
_open: weakref.WeakKeyDictionary[Releasable, int] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_registered = False


def watch(source: Releasable) -> None:
    """Close ``source``'s pool at interpreter exit unless it is closed first
    (the hook is registered with the first pool opened in this process).
    """
    global _registered
    with _lock:
        _open[source] = os.getpid()
        if not _registered:
            _registered = True
            atexit.register(_release_open)


def forget(source: Releasable) -> None:
    """``source``'s pool was closed: nothing to do for it at exit."""
    with _lock:
        _open.pop(source, None)


def _release_open() -> None:
    # Only the pools this process opened: a forked child inherits its
    # parent's hook and sources, and closing those would end (send a
    # Terminate on) the parent's sessions.
    pid = os.getpid()
    with _lock:
        sources = [source for source, opener in _open.items() if opener == pid]
    for source in sources:
        with contextlib.suppress(Exception):
            source.release()


def _after_fork_in_child() -> None:
    global _lock
    # A thread of the parent may have held it at the fork.
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
