"""What the worker hears from outside: the backend's wake-ups (PostgreSQL
LISTEN, SQLite's wake channel and ``data_version``) on a thread and a
connection of their own, handed to the producer; and SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
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


def install_signals(handler: Callable[[int, FrameType | None], None]) -> dict[int, Any]:
    """Handle SIGTERM and SIGINT with ``handler`` (only the main thread may);
    returns the handlers replaced, for :func:`restore_signals`.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}


def restore_signals(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`install_signals` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)
