"""``JobQueue.wait``: what a waiter does, written once as a sans-IO plan
(internal).

The plan yields the steps to take (wait for the watch to be ready, mark
the job as awaited, read it, sleep until woken) and is driven by a sync
driver (threads) and an async one (the event loop), so the two ``wait``
flavours cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Generator
from typing import Any

from jobkeeper.errors import ConfigError, DatabaseUnavailable, JobCancelled, JobFailed, JobNotFound
from jobkeeper.models import Job, JobStatus

#: Longest wait (s) for the process's watch to start listening before the
#: waiter falls back to polling.
READY_WAIT = 5.0
#: While the watch runs, a waiter still re-reads its job this often (s):
#: a backstop that costs nothing measurable and bounds any wake-up lost to
#: the unforeseen.
RECHECK = 30.0
#: Least time (s) a database step of a wait with a timeout gets, however
#: little of the timeout is left: a healthy database answers in
#: milliseconds; a hung one (a frozen server, which accepts and never
#: answers) makes the wait raise ``DatabaseUnavailable`` this long past
#: its timeout at most.
LEAST_CALL = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    """Wait up to ``seconds`` for the watch to listen; reply: whether it does."""

    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    """Mark the job as awaited; reply: None. The driver gives up after
    ``seconds`` (``math.inf``: never) and raises ``DatabaseUnavailable``.
    """

    seconds: float = math.inf


@dataclasses.dataclass(frozen=True, slots=True)
class Get:
    """Read the job (live or dead); reply: the Job or None. The driver arms
    its wake-up before reading, so an end after the read always wakes it,
    and gives up after ``seconds`` as for :class:`Mark`.
    """

    seconds: float = math.inf


@dataclasses.dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep until woken or ``seconds`` pass; reply: None."""

    seconds: float


Step = Ready | Mark | Get | Sleep
WaitPlan = Generator[Step, Any, Any]


def check_timeout(timeout: Any) -> float | None:
    """``timeout=`` of ``wait``: None or finite seconds >= 0.

    Raises:
        ConfigError: anything else.
    """
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise ConfigError(
            f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}"
        )
    return float(timeout)


def settled(job_id: int, job: Job | None) -> tuple[bool, Any]:
    """``(True, result)`` for a completed job, ``(False, None)`` for one
    still to wait for.

    Raises:
        JobNotFound, JobFailed, JobCancelled: as ``wait`` documents.
    """
    if job is None:
        raise JobNotFound(
            f"no job with id {job_id} (never enqueued, or finished and pruned after retention)"
        )
    if job.status == JobStatus.COMPLETED:
        return True, job.result
    if job.status == JobStatus.DEAD:
        raise JobFailed(job)
    if job.status == JobStatus.CANCELLED:
        raise JobCancelled(job)
    return False, None


def wait_plan(
    job_id: int, timeout: float | None, poll_interval: float, started: float | None = None
) -> WaitPlan:
    """The steps of one ``wait``; returns the result or raises. ``started``:
    the ``time.monotonic()`` the wait began at (default: now), from which
    ``timeout`` counts.
    """
    begun = time.monotonic() if started is None else started
    deadline = None if timeout is None else begun + timeout

    def left() -> float:
        return math.inf if deadline is None else deadline - time.monotonic()

    def call_time() -> float:
        return max(left(), LEAST_CALL)

    # Listening first, then the mark, then the read: an end committed
    # after the mark is heard, one committed before it is read.
    listening = yield Ready(min(left(), READY_WAIT))
    marked = False
    while True:
        # A database that is down for a moment (a restart, a failover) is
        # waited out like the job itself: until the timeout, then raised.
        try:
            if not marked:
                yield Mark(call_time())
                marked = True
            job = yield Get(call_time())
        except DatabaseUnavailable:
            if left() <= 0:
                raise
            yield Sleep(min(poll_interval, left()))
            continue
        done, result = settled(job_id, job)
        if done:
            return result
        remaining = left()
        if remaining <= 0:
            raise TimeoutError(f"job {job_id} did not finish within {timeout:g}s")
        yield Sleep(min(RECHECK if listening else poll_interval, remaining))
        if not listening:
            listening = yield Ready(0.0)
