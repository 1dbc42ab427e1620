"""How long a stopping worker may take when its database does not answer.

A worker whose database calls hang (a server that accepts and never
answers) could not be stopped: every thread sat in a call, SIGTERM and a
second SIGTERM were logged and nothing more, and the process was still
alive 101 s later (break-test 121), past any supervisor's stop timeout
(deploy/jobkeeper-worker.service gives 45 s). The stuck-call watchdog
(PostgreSQL) cuts such calls; this bounds the whole stop whatever held it
up: a worker stopped by a signal exits by :data:`EXIT_AFTER` seconds past
the documented end of its stop (``shutdown_grace`` after the first signal,
then the interrupt's wait), leaving what it holds to be rescued.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from jobkeeper.worker.log_output import flush_writers
from jobkeeper.worker.stopping import INTERRUPT_WAIT

logger = logging.getLogger("jobkeeper.worker")

#: Seconds past ``shutdown_grace`` plus the interrupt's wait (or past a
#: second signal plus that wait) after which a stop that has not finished
#: ends the process: enough to write outcomes and deregister on a server
#: that answers (SHUTDOWN_FLUSH is 3 s); with the default grace (30 s) the
#: worker is gone within 42 s, inside the unit's TimeoutStopSec=45.
EXIT_AFTER = 10.0
#: Most seconds a worker connection's call may go without an answer before
#: the stuck-call watchdog checks on it (see :func:`stuck_after_for`).
STUCK_AFTER_MAX = 10.0


def stuck_after_for(rescue_after: float) -> float:
    """The stuck-call threshold of a worker's connections: a quarter of
    ``rescue_after`` (at most 10 s, at least 1 s). A worker's claims stay
    fresh for half of ``rescue_after`` after its last heartbeat: a stuck
    heartbeat call is then found, checked (a probe of up to 5 s) and its
    connection replaced before they go stale.
    """
    return max(1.0, min(STUCK_AFTER_MAX, rescue_after / 4))


class ExitBound:
    """A timer armed by a signal's stop: unless :meth:`done` comes first,
    log what is still waiting and end the process with code 1.

    Args:
        worker_id: for the log line.
        rescue_after: for the log line (when what it holds is rescued).
        exit_now: what ends the process (``os._exit``; tests replace it).
    """

    def __init__(
        self,
        worker_id: str,
        rescue_after: float,
        exit_now: Callable[[int], object] = os._exit,
    ) -> None:
        self._worker_id = worker_id
        self._rescue_after = rescue_after
        self._exit_now = exit_now
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._at: float | None = None
        self._why = ""
        self._asked_at = 0.0
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, why: str) -> None:
        """End the process ``seconds`` from now (``why``: the budget, said
        in the log line), or sooner if armed so already.
        """
        with self._lock:
            at = time.monotonic() + seconds
            if self._at is not None and self._at <= at:
                return
            if self._at is None:
                self._asked_at = time.monotonic()
            self._at, self._why = at, why
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="jobkeeper-exit-bound", daemon=True
                )
                self._thread.start()

    def signalled(self, grace: float, *, again: bool) -> None:
        """Arm for a stop asked by a signal (``again``: a second one)."""
        if again:
            self.arm(
                INTERRUPT_WAIT + EXIT_AFTER,
                f"a second signal + {INTERRUPT_WAIT:g} s + {EXIT_AFTER:g} s",
            )
        else:
            self.arm(
                grace + INTERRUPT_WAIT + EXIT_AFTER,
                f"shutdown_grace={grace:g}s + {INTERRUPT_WAIT:g} s + {EXIT_AFTER:g} s",
            )

    def done(self) -> None:
        """The stop finished: nothing to end."""
        self._done.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                at = self._at
            assert at is not None
            remaining = at - time.monotonic()
            if remaining <= 0:
                break
            if self._done.wait(min(remaining, 0.5)):
                return
        if self._done.is_set():
            return
        waiting = waiting_calls()
        with contextlib.suppress(Exception):
            logger.error(
                "worker %s: the stop has not finished %.0f s after the signal (%s)%s; "
                "exiting now with code 1 without writing what is left: the jobs this "
                "worker holds are rescued %gs after its last heartbeat (rescue_after) "
                "and run again",
                self._worker_id,
                time.monotonic() - self._asked_at,
                self._why,
                f": database calls have not returned ({', '.join(waiting)})" if waiting else "",
                self._rescue_after,
            )
        _flush_logs()
        self._exit_now(1)


def waiting_calls() -> list[str]:
    """The backend operations threads are in (``job_stage_due`` on
    ``MainThread``), read off their stacks: what a stop waits on.
    """
    found: list[str] = []
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        operation = None
        walk: FrameType | None = frame
        while walk is not None:
            module = walk.f_globals.get("__name__", "")
            name = walk.f_code.co_name
            if module.startswith("jobkeeper.backends.") and not name.startswith("_"):
                operation = name  # the outermost public one wins
            walk = walk.f_back
        if operation is not None:
            found.append(f"{operation} on {names.get(ident, ident)}")
    return sorted(found)


def _flush_logs() -> None:
    """Flush log handlers and the standard streams, on a thread of its own
    for at most a second: a handler that blocks must not keep the process.
    """

    def flush() -> None:
        # The CLI's log lines go through a writer thread: os._exit skips the
        # atexit hook that writes what it holds.
        flush_writers(0.8)
        for ref in list(getattr(logging, "_handlerList", [])):
            handler = ref()
            if handler is not None:
                with contextlib.suppress(Exception):
                    handler.flush()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()

    thread = threading.Thread(target=flush, name="jobkeeper-exit-flush", daemon=True)
    thread.start()
    thread.join(1.0)
