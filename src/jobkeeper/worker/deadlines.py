"""The executor's deadline watch (internal): one thread calls back when a
watched key's deadline passes, unless the key was unwatched first.

It holds keys (job ids) and times only, never a job: a finished execution is
unwatched and forgotten at once, so a worker running jobs with long timeouts
keeps nothing of them once they end (issue 13: about 33 KB a job with 32 KB
args stayed until each deadline passed). Unwatched entries left in the heap
are dropped when they outnumber the live ones, so the heap stays within twice
the watched keys (plus a small floor).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("jobkeeper.worker")

#: Stale heap entries tolerated before a compaction whatever the live count
#: (compacting a tiny heap on every unwatch would be churn for nothing).
COMPACT_FLOOR = 64


class DeadlineWatch:
    """Calls ``on_deadline(key)`` on its own thread once per watch whose
    deadline (``time.monotonic()`` seconds) passes before it is unwatched.

    Args:
        on_deadline: the callback; it may call :meth:`watch` again (a reminder).
        name: the thread's name.
    """

    def __init__(self, on_deadline: Callable[[int], None], name: str) -> None:
        self._on_deadline = on_deadline
        self._name = name
        self._heap: list[tuple[float, int, int]] = []  # (deadline, seq, key)
        self._live: dict[int, int] = {}  # key -> seq of its current watch
        self._seq = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def __len__(self) -> int:
        """Heap entries, live and stale (for tests of the bound)."""
        with self._changed:
            return len(self._heap)

    def watch(self, key: int, deadline: float) -> None:
        """Call back for ``key`` at ``deadline``; replaces an earlier watch of it."""
        with self._changed:
            if self._closed:
                return
            seq = next(self._seq)
            self._live[key] = seq
            heapq.heappush(self._heap, (deadline, seq, key))
            self._compact()
            self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def unwatch(self, key: int) -> None:
        """Forget ``key`` (a no-op if it is not watched)."""
        if key not in self._live:
            # Most jobs have no timeout: no lock for them. A watch racing
            # this call is as if it came after it, lock or not.
            return
        with self._changed:
            if self._live.pop(key, None) is not None:
                self._compact()

    def _compact(self) -> None:
        """Drop unwatched entries once they outnumber the live ones (lock held)."""
        stale = len(self._heap) - len(self._live)
        if stale > COMPACT_FLOOR and stale > len(self._live):
            self._heap = [entry for entry in self._heap if self._live.get(entry[2]) == entry[1]]
            heapq.heapify(self._heap)

    def close(self) -> None:
        """Stop the thread and forget every watch: no callback starts after
        this returns (one already running finishes).
        """
        with self._changed:
            self._closed = True
            self._heap.clear()
            self._live.clear()
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._changed.wait(wait)
                if self._closed:
                    return
                _, seq, key = heapq.heappop(self._heap)
                if self._live.get(key) != seq:
                    continue  # unwatched, or watched again for later
                del self._live[key]
            try:
                self._on_deadline(key)
            except Exception:  # the watch must outlive a failing callback
                logger.exception("deadline callback failed for job %s", key)
