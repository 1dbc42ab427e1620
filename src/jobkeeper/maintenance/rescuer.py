"""The rescuer: gives held jobs of dead workers back to the queue.

A held job whose holder has not heartbeaten for ``rescue_after`` seconds
(or whose holder's row is gone) is rescued:

- ``running`` (started): the lost attempt is counted and recorded in
  ``errors`` as a lost worker, and the job becomes ``retryable`` after the
  usual backoff, ``dead`` if its attempts are used up, or ``cancelled`` if a
  cancel was asked for (Oban's Lifeline, River's JobRescuer).
- ``claimed`` (prefetched, its start not recorded): it took no part in the
  crash, so it goes back to ``available`` without spending the attempt
  (``unstarted_returns`` counts it; the log names the lost holder, and
  ``errors``, one entry per failed attempt, gets none). A
  start mark waits up to a flush interval in its worker, so a job that kills
  its worker as it starts can look unstarted. Such a job is returned once;
  its next claim writes the start mark before the task is called (see the
  worker's ``Claims.may_start``), so its next crashes spend attempts. Should those
  marks fail too, after ``MAX_UNSTARTED_RETURNS`` free returns its claims
  are rescued like running ones: it still reaches the dead letters (C-05).

The crash budget (DESIGN.md, "Poison jobs"): a ``running`` job rescued
this way is a crash suspect (``run_alone``): its next attempt runs alone on
its worker (see :mod:`jobkeeper.worker.slots`), whose start mark records the
claim's fence (``alone_fence``). A rescue of a running job whose
``alone_fence`` is its current fence is a crash pinned on it -- nothing else
ran on that worker -- and counts in ``crashes``; at ``max_crashes`` it goes to
the dead letters ("crashed its worker N times"), attempts left or not. A
rescue of an attempt that ran beside others only costs the attempt, as
above, and makes the next one run alone: the jobs that merely shared the
poison job's worker are never charged a crash. With ``max_crashes`` n, a job
that kills its worker every time reaches the dead letters after n + 1 lost
attempts (the first one unpinned), plus at most one free return of a claim
whose start mark had not been flushed.

Every rescue write is fenced on the ``(id, worker_id, attempt, fence)`` the
rescuer read and re-checks that the holder is still silent, so a job that
completed or was re-claimed in between is left alone (river#1302); a free
return also needs the job still ``claimed``.

Every worker runs a rescuer; the fenced writes make concurrent passes safe.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable

from jobkeeper.backends.base import Backend
from jobkeeper.config import Settings, holder_window
from jobkeeper.errors import DatabaseUnavailable
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.maintenance.service import IntervalService
from jobkeeper.models import Failure, FailureKind, Job, JobStatus
from jobkeeper.outcomes import (
    cancelled_attempt,
    failed_attempt,
    outcome_error,
    outcome_kind,
    returned_attempt,
)

logger = logging.getLogger("jobkeeper.maintenance")

#: Most jobs rescued per pass.
BATCH = 500
#: Seconds by which the database's clock may gain on this process's
#: monotonic clock between two passes before it counts as a step forward.
CLOCK_STEP_SLACK = 1.0
#: Free returns of a claimed (unstarted) job before a lost claim of it spends
#: the attempt like a lost running one. Bounds the crash loop of a job that
#: kills its worker before its start mark is flushed: with ``max_attempts``
#: n it dies after at most n + 3 crashes.
MAX_UNSTARTED_RETURNS = 3


class Rescuer(IntervalService):
    """Rescues orphaned running jobs; also prunes long-silent worker rows.

    Args:
        backend: a dedicated backend.
        settings: ``rescue_after`` and the retry policy.
        interval: seconds between passes.
        may_judge: asked before judging a holder, with its window (seconds);
            False leaves its jobs for a later pass (the worker's own heartbeat
            writes failed or waited on the database within that window:
            whatever held them up, an outage or a stall of SQLite's write
            lock, held up the other workers' alike, so their silence proves
            nothing).
        events: where RESCUED (and DEAD_LETTERED, for rescues that end in
            the dead letters) is emitted per job rescued.
        max_crashes_of: a job's crash budget (its task's ``max_crashes`` in
            this worker's app, else the setting); None: the setting for all.
        after_pass: called with the rescuer's backend after each pass (the
            worker's schema watch); it must not raise, and must not wait on
            a lock for long: the next pass waits for it.
        settle_first: judge no holder until this rescuer has run for the
            holder's whole window, as after an outage. A step of the
            database's clock just before the first pass cannot be told from
            silence (there is no earlier reading to compare with): a worker
            started right after a +100 s step took four jobs from two live
            workers in its first pass. The worker's rescuer settles; a
            holder's jobs are then rescued at its last beat plus its window
            or this rescuer's start plus that window, whichever is later.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        interval: float,
        may_judge: Callable[[float], bool] | None = None,
        events: EventBus | None = None,
        max_crashes_of: Callable[[Job], int] | None = None,
        after_pass: Callable[[Backend], None] | None = None,
        *,
        settle_first: bool = False,
    ) -> None:
        super().__init__("jobkeeper-rescuer", interval)
        self._after_pass = after_pass
        self._max_crashes_of = max_crashes_of
        self._events = events if events is not None else EventBus()
        self._backend = backend
        self._settings = settings
        self._may_judge = may_judge
        #: Total jobs this rescuer has rescued (for logs and tests).
        self.rescued = 0
        self._unreachable = False
        self._back_at = time.monotonic() if settle_first else -math.inf
        #: (monotonic clock just before, database clock) of the last pass's
        #: reading of the database's clock.
        self._clock: tuple[float, float] | None = None
        #: Completed passes (tests, logs).
        self.passes = 0

    def run_once(self) -> None:
        try:
            self._pass()
        except DatabaseUnavailable:
            self._unreachable = True
            raise
        if self._after_pass is not None:
            self._after_pass(self._backend)

    def _pass(self) -> None:
        rescue_after = self._settings.rescue_after
        if self._unreachable:
            # Back after an outage (a database restart, a lost connection):
            # every holder's last heartbeat is at least as old as the outage,
            # live ones included. Silence while the database was unreachable
            # does not count: a holder is judged only once the database has
            # been back for its whole window, the slack live workers get at
            # any other time, or their jobs would be rescued and run twice
            # (the soak showed it).
            self._backend.db_now()
            self._unreachable = False
            self._back_at = time.monotonic()
        # Each holder is judged by the window it declared (see holder_window:
        # rows from before schema version 2 declared none).
        unknown = holder_window(None, rescue_after)
        windows = {
            w.id: holder_window(w.rescue_after, rescue_after) for w in self._backend.worker_list()
        }
        candidates = self._backend.job_rescue_candidates(rescue_after=unknown, limit=BATCH)
        if self._clock_stepped():
            # Read after the candidates, so a step before their query is
            # seen; read every pass, so each reading has a recent one to
            # compare with.
            self._back_at = time.monotonic()
        since_back = time.monotonic() - self._back_at
        failures: list[Failure] = []
        returns: list[int] = []
        judged: dict[int, Job] = {}
        for job in candidates:
            # A holder without a row (deregistered, pruned) gets our window.
            window = windows.get(job.worker_id or "", rescue_after)
            if since_back < window or (self._may_judge is not None and not self._may_judge(window)):
                continue  # judged in a later pass, if still silent then
            judged[job.id] = job
            if job.cancel_requested:
                failures.append(
                    cancelled_attempt(job, f"cancelled; its worker {job.worker_id} was lost")
                )
                continue
            lost = f"worker lost: {job.worker_id} sent no heartbeat for more than {window:g}s"
            if job.status == JobStatus.CLAIMED:
                if job.unstarted_returns < MAX_UNSTARTED_RETURNS:
                    returns.append(job.id)
                    failures.append(returned_attempt(job))
                    continue
                error = (
                    f"{lost} before the start of attempt {job.attempt} was recorded "
                    f"(claims of this job lost unstarted {job.unstarted_returns + 1} times: "
                    "counted as an attempt)"
                )
            else:
                error = f"{lost} while running attempt {job.attempt}"
                if job.status == JobStatus.RUNNING:
                    failures.append(self._crash(job, error))
                    continue
            failures.append(failed_attempt(job, self._settings, error=error))
        self.passes += 1
        if failures:
            written = self._backend.job_fail_many(failures=failures, stale_after=unknown)
            self.rescued += len(written)
            if self._events.wants(EventKind.RESCUED) or self._events.wants(EventKind.DEAD_LETTERED):
                self._emit(failures, judged, written)
            if written:
                logger.warning(
                    "rescued %d jobs of lost workers: %s", len(written), sorted(written)[:20]
                )
            returned = sorted(written.intersection(returns))
            if returned:
                logger.warning(
                    "%d of them had not started: returned without spending the attempt: %s",
                    len(returned),
                    returned[:20],
                )
        # Rescue never depends on worker rows, so pruning them is only tidying.
        self._backend.worker_prune_stale(older_than=max(2 * rescue_after, 60.0))

    def _clock_stepped(self) -> bool:
        """Whether the database's clock stepped forward since the last
        reading, by more than the monotonic clock advanced around both
        readings: an NTP step or a VM's clock resync on the server (on
        SQLite, this machine's clock). Every live holder's last beat then
        looks older by the step until it beats again; judged now, each would
        lose its job to a rescue while it ran (and, running alone, be
        charged a crash). Such a pass leaves every holder a whole window, as
        after an outage. A step backward only delays rescues by its size.
        """
        before = time.monotonic()
        now = self._backend.db_now().timestamp()
        last, self._clock = self._clock, (before, now)
        if last is None:
            return False
        last_before, last_now = last
        # From before the last reading to after this one: the most the
        # database's clock can have advanced without a step.
        gained = (now - last_now) - (time.monotonic() - last_before)
        if gained <= CLOCK_STEP_SLACK:
            return False
        logger.warning(
            "the database's clock moved %.0f s more than this process's since the rescuer's "
            "last pass (a clock step): no worker is judged silent until each has had its "
            "rescue_after to beat again",
            gained,
        )
        return True

    def _crash(self, job: Job, lost: str) -> Failure:
        """The rescue of a running job, under the crash budget: a suspect
        (its next attempt runs alone), and when this attempt ran alone, a
        crash pinned on it -- dead at ``max_crashes``.
        """
        if not (job.run_alone and job.alone_fence == job.fence):
            # Started beside other jobs, or given up by its worker at
            # shutdown (job_abandon_many): nothing says it crashed its worker.
            error = f"{lost} (not counted as a crash: not known to run alone; next attempt alone)"
            failure = failed_attempt(job, self._settings, error=error)
            return dataclasses.replace(failure, suspect=True)
        crashes = job.crashes + 1
        limit = (
            self._max_crashes_of(job)
            if self._max_crashes_of is not None
            else self._settings.max_crashes
        )
        times = f"{crashes} time{'s' if crashes != 1 else ''}"
        error = f"{lost}, alone: crashed its worker {times} (max_crashes={limit})"
        failure = failed_attempt(job, self._settings, error=error)
        if crashes >= limit and failure.outcome != FailureKind.DEAD:
            reason = (
                f"crashed its worker {times} (max_crashes={limit}), each time "
                f"running alone; {job.max_attempts - job.attempt} attempts were left"
            )
            failure = Failure(failure.claim, FailureKind.DEAD, failure.error_json, reason=reason)
        elif crashes >= limit:
            failure = dataclasses.replace(
                failure,
                reason=f"crashed its worker {times} (max_crashes={limit}); {failure.reason}",
            )
        return dataclasses.replace(failure, suspect=True, crash=True)

    def _emit(self, failures: list[Failure], jobs: dict[int, Job], written: set[int]) -> None:
        """RESCUED per rescue written (the event's worker is the lost holder),
        and DEAD_LETTERED when the rescue moved the job to the dead letters.
        """
        for failure in failures:
            job = jobs.get(failure.claim.job_id)
            if job is None or job.id not in written:
                continue
            self._events.emit(
                JobEvent.of(
                    EventKind.RESCUED,
                    job,
                    outcome=outcome_kind(failure),
                    error=outcome_error(failure),
                    keep_job=False,
                )
            )
            if failure.outcome == "dead":
                self._events.emit(
                    JobEvent.of(EventKind.DEAD_LETTERED, job, error=failure.reason, keep_job=False)
                )
