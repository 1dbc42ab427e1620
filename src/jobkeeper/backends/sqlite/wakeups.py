"""SQLite's wake-ups: what LISTEN/NOTIFY is on PostgreSQL, from two sources.

- In-process: a commit that makes jobs available (an enqueue, a staging, a
  retry) wakes the listeners of this process on the same database file at
  once (:func:`wake`).
- Other processes: SQLite has no notifications, but ``PRAGMA data_version``
  changes on a connection whenever another connection commits. The listener
  reads it every ``CHANGE_POLL`` seconds on its own connection: a counter in
  the WAL's shared memory, a few microseconds and no I/O, so a short period
  buys a pickup latency of about half of it for next to no CPU.

Either way the listener calls ``on_queue("*")``: SQLite cannot say what the
commit was (a delayed enqueue by another process sends no due time), so the
worker looks for work and stages due jobs soon after.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from jobkeeper.errors import DatabaseError

logger = logging.getLogger("jobkeeper.sqlite")

#: Seconds between two reads of ``data_version`` by a listener.
CHANGE_POLL = 0.01
#: Seconds a listener waits after a failed read before it reads again.
ERROR_PAUSE = 0.1

# Listener events per database file (absolute path), set by commits of this
# process.
_listeners: dict[str, set[threading.Event]] = {}
_listeners_lock = threading.Lock()


def wake(path: str) -> None:
    """Wake this process's listeners on the database file ``path``."""
    with _listeners_lock:
        events = list(_listeners.get(path, ()))
    for event in events:
        event.set()


def listen(
    path: str,
    data_version: Callable[[], int],
    on_queue: Callable[[str], None],
    stop: threading.Event,
) -> None:
    """Call ``on_queue("*")`` on every in-process wake-up for ``path`` and
    every change of ``data_version()`` until ``stop`` is set.

    Args:
        path: the database file's absolute path.
        data_version: reads ``PRAGMA data_version`` on the listener's own
            connection (it raises :class:`~jobkeeper.errors.DatabaseError`).
        on_queue: the worker's wake-up.
        stop: set to return.
    """
    event = threading.Event()
    with _listeners_lock:
        _listeners.setdefault(path, set()).add(event)
    try:
        version: int | None = None
        while not stop.is_set():
            if event.wait(CHANGE_POLL):
                event.clear()
                on_queue("*")
            try:
                current = data_version()
            except DatabaseError as exc:
                # A locked or briefly unreadable file: something is going on,
                # so look for work, and read again after a pause.
                logger.debug("data_version unreadable (%s)", exc)
                on_queue("*")
                version = None
                stop.wait(ERROR_PAUSE)
                continue
            if version is not None and current != version:
                on_queue("*")
            version = current
    finally:
        with _listeners_lock:
            listeners = _listeners.get(path)
            if listeners is not None:
                listeners.discard(event)
                if not listeners:
                    del _listeners[path]
