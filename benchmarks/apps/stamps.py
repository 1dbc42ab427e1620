"""Start-time stamps for the latency measurement.

A task calls :func:`record` first thing; it appends ``"<i> <enqueued_at> <started_at>"``
to the file named by ``$BENCH_STAMP_FILE`` (one ``os.write`` on an ``O_APPEND``
descriptor per job, so lines from several threads never interleave). Both
times come from ``time.time()`` on the same host, so they compare directly.
Without ``$BENCH_STAMP_FILE`` nothing is written.
"""

from __future__ import annotations

import os
import threading
import time

STAMP_FILE_ENV = "BENCH_STAMP_FILE"

_fd: int | None = None
_lock = threading.Lock()


def _descriptor() -> int | None:
    global _fd
    if _fd is None:
        path = os.environ.get(STAMP_FILE_ENV)
        if not path:
            return None
        with _lock:
            if _fd is None:
                _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _fd


def record(i: int, t: float) -> None:
    """Record that job ``i``, enqueued at ``t`` (``time.time()``), starts now."""
    started = time.time()
    fd = _descriptor()
    if fd is not None:
        os.write(fd, f"{i} {t!r} {started!r}\n".encode())
