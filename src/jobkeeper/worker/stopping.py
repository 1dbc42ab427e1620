"""A stopping worker's running jobs: the grace period, the interrupt, the
last flush of their outcomes.

What the runner does around it (resigning the lead, stopping the services,
deregistering) is the runner's; this is only how running work ends.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from jobkeeper.backends.base import Backend
from jobkeeper.errors import DatabaseError
from jobkeeper.models import Job
from jobkeeper.outcomes import claim_of
from jobkeeper.worker.completer import Completer
from jobkeeper.worker.executor import Executor

logger = logging.getLogger("jobkeeper.worker")

#: Seconds a stopping worker waits, after interrupting the jobs still running
#: past the grace period, for their code to return.
INTERRUPT_WAIT = 2.0
#: Seconds a stop gives unwritten outcomes beyond what is left of the grace
#: period. Enough for acks to reach a healthy (or just restarted) server; not
#: a wait without end on one that refuses writes (read-only, out of disk):
#: what is still unwritten then is rescued and run again (at-least-once).
SHUTDOWN_FLUSH = 3.0


@dataclass(frozen=True)
class Stopped:
    """How the running work ended.

    Attributes:
        stuck: jobs whose code did not return after the interrupt; they stay
            held by this worker (see :func:`stop_running`).
        flushed: every outcome was written.
        left_held: how many jobs this worker still holds in the database:
            the stuck ones and those whose outcome, hand-back or start mark
            could not be written.
    """

    stuck: list[Job]
    flushed: bool
    left_held: int


def stop_running(
    executor: Executor,
    completer: Completer,
    backend: Backend,
    *,
    grace: float,
    force: threading.Event,
    rescue_after: float,
    gone: str | None = None,
    since: float | None = None,
) -> Stopped:
    """End a stopping worker's work: hand back what was claimed but never
    started, let running jobs finish for up to ``grace`` seconds (less once
    ``force`` is set), interrupt the rest, then write every outcome.

    Args:
        executor: the worker's executor.
        completer: the worker's completer; stopped here.
        backend: where the jobs given up on are marked as such.
        grace: seconds running jobs get to finish (``shutdown_grace``).
        force: set by a second signal: skip what is left of the grace period.
        rescue_after: seconds after the last heartbeat that stuck jobs are
            rescued (only for the log line).
        gone: the path of the SQLite file that was removed or replaced under
            the worker: its jobs are in that file, where nothing can be
            written and nothing rescues them, and the log lines say so.
        since: when the stop was asked (``time.monotonic()``; None: now):
            the grace period runs from it, not from when the worker's main
            thread got here (a call the database left unanswered held it
            up, and the grace began again after it).

    Returns:
        Stopped: what is left held, and whether every outcome was written.
    """
    # Claimed but never started: handed back at once, with no errors entry
    # (with a deep prefetch a stop would add one to every buffered job).
    executor.hand_back(stop_starting=True)
    deadline = (time.monotonic() if since is None else since) + grace
    while executor.snapshot().active and not force.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        executor.wait_idle(min(remaining, 0.1))
    held = (
        f"in the removed file {gone!r}, where nothing rescues them"
        if gone
        else f"to be rescued {rescue_after:g}s after its last heartbeat"
    )
    stuck = (
        _interrupt_running(executor, _reason(grace, force.is_set(), gone), held, rerun=not gone)
        if executor.snapshot().active
        else []
    )
    if stuck and not gone:
        _abandon(backend, stuck)
    flush_for = SHUTDOWN_FLUSH if force.is_set() else deadline - time.monotonic()
    if gone:
        # No write reaches a removed file: not retried for seconds.
        flushed = completer.stop(0.0, then=f"their jobs are {held} or runs them again")
    else:
        flushed = completer.stop(timeout=max(flush_for, SHUTDOWN_FLUSH))
    left_held = len({job.id for job in stuck} | completer.pending_ids())
    return Stopped(stuck=stuck, flushed=flushed, left_held=left_held)


def _reason(grace: float, forced: bool, gone: str | None) -> str:
    """Why running jobs are interrupted, as their attempts record it."""
    if gone:
        return f"worker stopped: its SQLite file {gone!r} was removed or replaced"
    if forced:
        return "worker shutdown: handed back at once (stop forced by a second signal)"
    return f"worker shutdown: handed back after shutdown_grace={grace:g}s"


def _interrupt_running(executor: Executor, reason: str, held: str, *, rerun: bool) -> list[Job]:
    """Past the grace period: interrupt what still runs, wait up to
    ``INTERRUPT_WAIT`` seconds for its code to return (handed back then),
    and give up on the rest. Returns the jobs given up on.

    Those are not handed back: another worker would start them while
    their code still runs here (two live holders). They stay held by
    this worker; once its heartbeat stops they are rescued after
    ``rescue_after`` (the attempt counted), as if it had crashed.
    """
    asked = executor.interrupt_all(reason)
    logger.warning("interrupting %d jobs still running at shutdown", asked)
    executor.wait_idle(INTERRUPT_WAIT)
    running, reporting = executor.abandon_running()
    if running:
        logger.error(
            "%d jobs did not return %gs after being interrupted at shutdown and stay held "
            "by this worker, %s (not handed back: their code may still be running): %s",
            len(running),
            INTERRUPT_WAIT,
            held,
            _named(running),
        )
    if reporting:
        logger.error(
            "%d jobs returned, but their outcomes are still with the worker's event "
            "listeners (a log handler or span exporter that blocks), so nothing of them is "
            "written: they stay held by this worker, %s%s: %s",
            len(reporting),
            held,
            " and run again" if rerun else "",
            _named(reporting),
        )
    return running + reporting


def _named(jobs: list[Job]) -> str:
    return ", ".join(f"{job.id} ({job.task})" for job in jobs)


def _abandon(backend: Backend, stuck: list[Job]) -> None:
    """Jobs whose code did not return stay held for the rescue, which counts
    their attempt; but the worker stopped on purpose, so the rescue pins no
    crash on them (three deploys over a job blocked in C dead-lettered it
    as "crashed its worker").
    """
    try:
        backend.job_abandon_many(claims=[claim_of(job) for job in stuck])
    except DatabaseError as exc:
        logger.warning(
            "could not mark %d jobs given up at shutdown (%s): one that ran alone is "
            "charged a crash when rescued",
            len(stuck),
            exc,
        )
