"""The soak's tasks, run by worker processes:

    python -m jobkeeper --database URL worker --app benchmarks.soak.app:jq

Settings come from the environment (the driver sets them), so the workers and
the driver agree on ``rescue_after``: ``SOAK_HEARTBEAT_INTERVAL``,
``SOAK_RESCUE_AFTER``, ``SOAK_POLL_INTERVAL``, ``SOAK_MAX_BACKOFF``,
``SOAK_SHUTDOWN_GRACE`` (seconds), ``SOAK_MAX_CRASHES``. Logged tasks append ``start``/``end``
events to ``$SOAK_LOG_DIR`` (see :mod:`benchmarks.soak.history`) and return
``{"n", "worker", "attempt"}``: the execution that produced the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from jobkeeper import Discard, JobQueue, Retry, current_job
from jobkeeper.verify.history import ExecLog


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


SETTINGS: dict[str, float] = {
    "heartbeat_interval": _seconds("SOAK_HEARTBEAT_INTERVAL", 0.5),
    "rescue_after": _seconds("SOAK_RESCUE_AFTER", 3.0),
    "poll_interval": _seconds("SOAK_POLL_INTERVAL", 0.2),
    "max_backoff": _seconds("SOAK_MAX_BACKOFF", 0.5),
    "shutdown_grace": _seconds("SOAK_SHUTDOWN_GRACE", 5.0),
}

# No URL: JOBKEEPER_DATABASE_URL (the driver sets it, and the CLI's
# --database too), so the tasks and the worker share the worker's database.
jq = JobQueue(**SETTINGS, max_crashes=int(os.environ.get("SOAK_MAX_CRASHES", "2")))

_log_dir = os.environ.get("SOAK_LOG_DIR")
LOG = ExecLog(_log_dir) if _log_dir else None


class InjectedError(RuntimeError):
    """The failure a soak task raises on purpose."""


class Run(NamedTuple):
    """One execution, as the log and the result name it."""

    job: int
    attempt: int
    worker: str
    fence: int


def _begin() -> Run:
    job = current_job()
    assert job.worker_id is not None
    run = Run(job.id, job.attempt, job.worker_id, job.fence)
    if LOG is not None:
        LOG.start(*run)
    return run


def _end(run: Run, outcome: str) -> None:
    if LOG is not None:
        LOG.end(*run, outcome)


@contextlib.contextmanager
def _logged() -> Iterator[Run]:
    """Log this execution's ``start``, then its ``end``: ``ok`` if the block
    finished, ``error`` if anything (a failure, a cancel) left it early.
    """
    run = _begin()
    outcome = "error"
    try:
        yield run
        outcome = "ok"
    finally:
        _end(run, outcome)


def _result(n: int, run: Run) -> dict[str, Any]:
    """The result naming the execution that produced it."""
    return {"n": n, "worker": run.worker, "attempt": run.attempt, "fence": run.fence}


def _decide(mode: str, attempt: int, fails: int) -> None:
    """Raise the failure ``mode`` asks for on this attempt, if any."""
    if mode == "fail" or (mode == "flaky" and attempt <= fails):
        raise InjectedError(f"{mode} on attempt {attempt}")
    if mode == "retry" and attempt <= fails:
        raise Retry(delay=random.uniform(0.0, 0.2), reason=f"retry on attempt {attempt}")
    if mode == "discard":
        raise Discard("discarded on purpose")


def _burn(seconds: float) -> None:
    """Pure-Python busy loop: holds the GIL between switch intervals."""
    deadline = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < deadline:
        for i in range(1000):
            x += i * i


@jq.task(name="soak.work")
def work(n: int, ms: float, mode: str = "ok", fails: int = 0, cpu: bool = False) -> dict[str, Any]:
    """Spends ``ms`` milliseconds (sleeping, or burning CPU), then succeeds or
    fails as ``mode`` says: ok | flaky (fails ``fails`` times) | retry (raises
    Retry ``fails`` times) | fail (always) | discard.
    """
    with _logged() as execution:
        if cpu:
            _burn(ms / 1000)
        else:
            time.sleep(ms / 1000)
        _decide(mode, execution.attempt, fails)
    return _result(n, execution)


@jq.task(name="soak.work_async")
async def work_async(n: int, ms: float, mode: str = "ok", fails: int = 0) -> dict[str, Any]:
    """The async variant of ``soak.work``."""
    with _logged() as execution:
        await asyncio.sleep(ms / 1000)
        _decide(mode, execution.attempt, fails)
    return _result(n, execution)


@jq.task(name="soak.noop")
def noop(n: int) -> None:
    """Does nothing (the memory phase): no log, no result."""
    return None


@jq.task(name="soak.long_cpu")
def long_cpu(n: int, seconds: float) -> dict[str, Any]:
    """A CPU-bound sync task running ``seconds``, longer than rescue_after."""
    with _logged() as execution:
        _burn(seconds)
    return _result(n, execution)


@jq.task(name="soak.long_async_block")
async def long_async_block(n: int, seconds: float, cpu: bool = False) -> dict[str, Any]:
    """An async task that blocks the event loop for ``seconds`` (a blocking
    sleep, or a CPU-bound loop) without ever awaiting.
    """
    with _logged() as execution:
        if cpu:
            _burn(seconds)
        else:
            time.sleep(seconds)
    return _result(n, execution)


@jq.task(name="soak.stall")
def stall(n: int, seconds: float) -> dict[str, Any]:
    """Sleeps ``seconds`` on its first attempt only (a job to SIGKILL a worker
    under, and see rescued and completed by another).
    """
    with _logged() as execution:
        if execution.attempt == 1:
            time.sleep(seconds)
    return _result(n, execution)


@jq.task(name="soak.poison", max_attempts=20)
def poison(n: int) -> None:
    """A poison job: SIGKILLs its own worker at every attempt. The crash
    budget (``max_crashes``, default 2) must send it to the dead letters
    after at most ``max_crashes + 1`` lost attempts, and charge the jobs
    running beside it nothing.
    """
    _begin()
    time.sleep(0.05)  # the jobs beside it keep running meanwhile
    os.kill(os.getpid(), signal.SIGKILL)
