"""The exit bound's last line (why the worker exits, what becomes of its
jobs) is written before ``os._exit``. The CLI logs through a writer thread
(``log_to_stderr``) whose queued lines an ``atexit`` hook writes, and
``os._exit`` runs no hook: a clean-clone run saw a worker exit 1 with that
line missing from its log.
"""

from __future__ import annotations

import io
import logging
import threading
import time

from jobkeeper.worker.exit_bound import ExitBound
from jobkeeper.worker.log_output import log_to_stderr


class SlowStream(io.StringIO):
    """A stderr whose writes take a while (a pipe read slowly)."""

    def write(self, text: str) -> int:
        time.sleep(0.2)
        return super().write(text)


def test_the_exit_line_is_written_before_the_process_ends() -> None:
    root = logging.getLogger()
    kept_handlers, kept_level = root.handlers[:], root.level
    root.handlers = []  # log_to_stderr leaves a process's own logging alone
    stream = SlowStream()
    written_at_exit: list[str] = []
    exited = threading.Event()

    def exit_now(code: int) -> None:
        written_at_exit.append(stream.getvalue())
        exited.set()

    try:
        writer = log_to_stderr(logging.INFO, logging.Formatter("%(message)s"), stream)
        assert writer is not None
        ExitBound("w1", 60.0, exit_now=exit_now).arm(0.0, "a test")
        assert exited.wait(10)
        writer.stop_within(2)
    finally:
        root.handlers, root.level = kept_handlers, kept_level
    assert "exiting now with code 1" in written_at_exit[0], written_at_exit
