"""What the worker hears from outside: the backend's wake-ups (PostgreSQL
LISTEN, SQLite's wake channel and ``data_version``) on a thread and a
connection of their own, handed to the producer; and SIGTERM/SIGINT.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from jobkeeper.backends.base import Backend
from jobkeeper.worker.producer import Producer

logger = logging.getLogger("jobkeeper.worker")


def start_listener(backend: Backend, producer: Producer, stop: threading.Event) -> threading.Thread:
    """Start listening on ``backend`` (a dedicated one, closed when the
    listener ends) until ``stop`` is set; returns the started thread.
    """

    def listen() -> None:
        try:
            backend.listen(on_queue=producer.on_queue, stop=stop, on_due=producer.on_due)
        except Exception:
            # Wake-ups only hasten what staging every poll_interval finds.
            logger.exception("the wake-up listener stopped; polling every poll_interval")
        finally:
            backend.close()

    thread = threading.Thread(target=listen, name="jobkeeper-listener", daemon=True)
    thread.start()
    return thread


class SignalRelay:
    """SIGTERM and SIGINT, handled on a thread of this relay's own.

    A Python signal handler runs on the main thread between two bytecodes,
    which may be inside ``threading.Event.wait`` on that thread (the
    producer's wait) with the event's lock held: a handler that set that
    event waited for its own lock forever, and the worker never stopped. The
    handler here only writes the signal's number to a pipe; the relay thread
    reads it and calls ``handler`` like any other thread.

    Args:
        handler: called with ``(signum, None)`` on the relay thread.
    """

    def __init__(self, handler: Callable[[int, FrameType | None], None]) -> None:
        self._handler = handler
        self._previous: dict[int, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        """Take over SIGTERM and SIGINT (only the main thread may; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._pipe = os.pipe()
        os.set_blocking(self._pipe[1], False)
        self._thread = threading.Thread(
            target=self._relay, args=(self._pipe[0],), name="jobkeeper-signals", daemon=True
        )
        self._thread.start()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced and end the relay."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._pipe is None or self._thread is None:
            return
        os.write(self._pipe[1], b"\0")  # the relay's cue to end
        self._thread.join(timeout=5)
        for fd in self._pipe:
            os.close(fd)
        self._pipe, self._thread = None, None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._pipe is None:
            return
        # A full pipe holds signals not yet relayed: a stop is on its way.
        with contextlib.suppress(BlockingIOError):
            os.write(self._pipe[1], bytes([signum]))

    def _relay(self, read_fd: int) -> None:
        while True:
            for signum in os.read(read_fd, 64):
                if signum == 0:
                    return
                try:
                    self._handler(signum, None)
                except Exception:  # the relay must outlive a failed handler
                    with contextlib.suppress(Exception):  # and a failed log handler
                        logger.exception("handling signal %d failed", signum)
