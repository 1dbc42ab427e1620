"""Wake-ups for ``wait``: one watcher thread per process and database
(internal).

Every waiter of a process registers the job id it waits for with the
:class:`CompletionWatch` of its database and a callback; one daemon thread
runs the backend's *source* (PostgreSQL: one connection that LISTENs for
the ends of awaited jobs; SQLite: one connection that watches
``PRAGMA data_version``) and calls the callbacks of the jobs that may have
ended. A callback only wakes its waiter, which re-reads the job: a spurious
wake-up costs one read, a missed one is impossible as long as the source
is running, and when it is not (the connection dropped) every waiter is
woken to re-read and then polls until the source is back. The thread stops
after ``IDLE_STOP`` seconds without waiters, closing its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

logger = logging.getLogger("jobkeeper")

#: Seconds without any waiter after which the watcher thread closes its
#: connection and ends (the next waiter starts it again).
IDLE_STOP = 5.0


class WatchSource(Protocol):
    """What a backend watches with (one per watcher thread)."""

    def run(self, watch: CompletionWatch) -> None:
        """Watch until ``watch.should_stop()``: call ``watch.set_ready(True)``
        once ends are being watched (from then on none may be missed),
        ``watch.deliver(ids)`` with the ids of jobs that may have ended, and
        ``watch.set_ready(False)`` before raising or returning. A source that
        finds it cannot watch (yet) calls ``watch.set_unwatched()``, so that
        waiters poll at once instead of waiting for it. Connection errors
        may be raised: the watch wakes everyone and runs it again.
        """
        ...


class CompletionWatch:
    """The process-wide registry of waiters of one database."""

    def __init__(self, make_source: Callable[[], WatchSource], name: str) -> None:
        self._make_source = make_source
        self._name = name
        self._lock = threading.Lock()
        self._waiters: dict[int, set[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        #: Set once the source said whether it watches (ready, or unwatched).
        self._decided = threading.Event()
        # Called (once) when it says so: the async waiters' wake-ups.
        self._on_decided: list[Callable[[], None]] = []
        self._idle_since = time.monotonic()

    def register(self, job_id: int, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` (from the watcher thread) whenever job ``job_id``
        may have ended; returns the function that unregisters it.
        """
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(wake)
            if self._thread is None or not self._thread.is_alive():
                self._ready.clear()
                self._decided.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"jobkeeper-wait-{self._name}", daemon=True
                )
                self._thread.start()

        def unregister() -> None:
            with self._lock:
                wakes = self._waiters.get(job_id)
                if wakes is not None:
                    wakes.discard(wake)
                    if not wakes:
                        del self._waiters[job_id]
                if not self._waiters:
                    self._idle_since = time.monotonic()

        return unregister

    def stop_if_idle(self) -> None:
        """``close()``: with nobody waiting, the thread stops at its next look
        at :meth:`should_stop` (PostgreSQL's LISTEN every ``LISTEN_SLICE``,
        0.5 s; SQLite's every ``DATA_VERSION_POLL``), closing its connection,
        not ``IDLE_STOP`` seconds later. With waiters (another thread's, or
        another queue's on this database), it goes on for them.
        """
        with self._lock:
            if not self._waiters:
                self._idle_since = -math.inf

    def wait_ready(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until ends are watched, or the
        source said they cannot be; False if they are not watched (the
        waiter must then poll).
        """
        self._decided.wait(max(timeout, 0.0))
        return self._ready.is_set()

    async def wait_ready_async(self, timeout: float) -> bool:
        """:meth:`wait_ready` for the event loop: it holds no thread while
        it waits (in ``asyncio.to_thread``, 50 waiters started while the
        database was down held the loop's default executor, 6 threads on
        2 cores, and returned in batches, 9x past their timeout).
        """
        loop = asyncio.get_running_loop()
        decided = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(decided.set)

        with self._lock:
            if not self._decided.is_set():
                self._on_decided.append(wake)
            else:
                decided.set()
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a
            # cancel that comes in the loop step in which ``decided`` is set.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout, 0.0)):
                    await decided.wait()
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._on_decided.remove(wake)
        return self._ready.is_set()

    def _decide(self) -> None:
        """The source said whether it watches: wake whoever waits for that."""
        with self._lock:
            self._decided.set()
            wakes, self._on_decided = self._on_decided, []
        for wake in wakes:
            with contextlib.suppress(Exception):  # a closed loop
                wake()

    @property
    def ready(self) -> bool:
        """Whether ends are being watched now."""
        return self._ready.is_set()

    def waiting_ids(self) -> list[int]:
        """The job ids someone waits for now."""
        with self._lock:
            return list(self._waiters)

    def deliver(self, job_ids: Iterable[int]) -> None:
        """Wake the waiters of ``job_ids`` (called by the source)."""
        with self._lock:
            wakes = [wake for job_id in job_ids for wake in self._waiters.get(job_id, ())]
        for wake in wakes:
            with contextlib.suppress(Exception):
                wake()

    def deliver_all(self) -> None:
        """Wake every waiter (the source lost track: they re-read)."""
        self.deliver(self.waiting_ids())

    def set_ready(self, ready: bool) -> None:
        if ready:
            self._ready.set()
            self._decide()
        else:
            self._ready.clear()

    def set_unwatched(self) -> None:
        """Ends are not watched, and will not be soon: waiters poll now."""
        self._ready.clear()
        self._decide()

    def should_stop(self) -> bool:
        """True once nobody has waited for ``IDLE_STOP`` seconds; the thread
        is then forgotten under the lock, so a new waiter starts another.
        """
        with self._lock:
            if self._waiters or time.monotonic() - self._idle_since < IDLE_STOP:
                return False
            self._thread = None
            self._ready.clear()
            self._decided.clear()
            return True

    def _run(self) -> None:
        pause = 0.05
        while True:
            try:
                self._make_source().run(self)
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any error
                self.set_ready(False)
                logger.warning("waiting for jobs: watch failed (%s); waiters poll meanwhile", exc)
                self.deliver_all()
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
                with self._lock:
                    if not self._waiters and time.monotonic() - self._idle_since >= IDLE_STOP:
                        self._thread = None
                        return
                continue
            return  # should_stop() said so (and cleared ready under the lock)


_watches: dict[str, CompletionWatch] = {}
_watches_lock = threading.Lock()


def watch_for(key: str, make_source: Callable[[], WatchSource], name: str) -> CompletionWatch:
    """The process's one watch of the database identified by ``key``."""
    with _watches_lock:
        watch = _watches.get(key)
        if watch is None:
            watch = _watches[key] = CompletionWatch(make_source, name)
        return watch


def _after_fork_in_child() -> None:
    """A forked child starts with no watch: the parent's had its waiters
    (their wake-ups would reach the parent's event loops through inherited
    sockets), its thread state and a lock a thread of the parent may have
    held. The child's first waiter starts its own watch and thread.
    """
    global _watches, _watches_lock
    _watches = {}
    _watches_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
