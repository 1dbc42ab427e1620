"""The producer: the worker's claim loop, on the thread that runs the worker.

Each turn it hands back claims whose reply was lost (after a connection
error), stages due jobs when their time comes, hands back prefetched jobs
stuck behind slow ones, and claims as many jobs as there are free slots plus
the prefetch; then it sleeps until a slot frees up, a wake-up arrives, or it
is time to stage again. The executor only ever hears from it through
:meth:`~jobkeeper.worker.executor.Executor.offer`, and it reads the executor
only through its snapshot. The model is Oban's producer
(``oban-bg/oban:lib/oban/queue/producer.ex``) and River's: one loop that owns
the decision to fetch.

Wake-ups come from the backend's listener (see
:meth:`jobkeeper.backends.base.Backend.listen`): a queue name (jobs became
available there), ``"*"`` (anything may have changed: a reconnect, a commit
by another SQLite connection), or a queue and the seconds until one of its
delayed jobs comes due.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from jobkeeper.backends.base import Backend
from jobkeeper.config import Settings
from jobkeeper.errors import DatabaseError, DatabaseReplaced, DatabaseUnavailable
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.outcomes import released_attempt
from jobkeeper.worker.burst import BURST_CLAIM_FAILURES, stop_after_outage
from jobkeeper.worker.claim_hold import ClaimHold
from jobkeeper.worker.claims import Claims
from jobkeeper.worker.completer import Completer
from jobkeeper.worker.executor import Executor
from jobkeeper.worker.slots import ExecutorState
from jobkeeper.worker.step_logs import log_failed, log_unavailable

logger = logging.getLogger("jobkeeper.worker")

#: Least time, in seconds, from one staging to the next one prompted by a
#: ``"*"`` wake-up (on SQLite, any commit of another connection: it may have
#: been a delayed enqueue by another process, which sends no wake-up of its
#: own). Commits can come by the thousand: this bounds the extra stagings
#: (each a lock-free read) to ten a second.
CHANGE_RESTAGE_GAP = 0.1
#: More queues than this are first narrowed, in one statement, to those with
#: an available job (see ``_claim_order``): a claim of an empty queue is a
#: statement of its own (5,000 queues: 4,265 a second, idle). With up to
#: eight, an idle pass costs a few round trips and a busy one no probe.
PROBE_QUEUES_ABOVE = 8
#: Most jobs a worker may hold beyond its free slots (``prefetch``).
MAX_PREFETCH = 10_000
#: The adaptive prefetch holds at most the backend's ``prefetch_per_slot``
#: jobs per slot, and at most this many in all.
MAX_ADAPTIVE_PREFETCH = 1_000
#: Seconds between two readings of which of our queues have a concurrency
#: cap (one small read; a cap set or lifted meanwhile only changes how
#: promptly outcomes are written and how much is claimed, see ``capped``).
CAPPED_RECHECK = 2.0
#: Seconds without a job starting, every slot busy, after which an adaptive
#: worker hands its prefetched jobs back (``Executor.hand_back``).
PREFETCH_STALL = 1.0
#: Longest wait, in seconds, of a drained burst worker for its rescuer's
#: first pass (see ``drain_after``): a rescuer that cannot finish one must
#: not keep a script's worker from ever ending.
BURST_RESCUE_WAIT = 10.0
#: Seconds between a drained burst worker's looks at its rescuer's first pass.
BURST_RESCUE_RECHECK = 0.05


class Producer:
    """The claim loop of one worker.

    Args:
        backend: the producer's own backend (its own connection).
        worker_id: this worker's id (the claims' holder).
        settings: ``poll_interval``.
        queues: queue names to claim from, in order.
        concurrency: most jobs running at once.
        prefetch: fixed jobs to hold beyond the free slots; None: adaptive
            (see :attr:`prefetch`).
        burst: stop once nothing is left to run (see :meth:`run`).
        executor: where claimed jobs go.
        completer: asked what is still unwritten.
        claims: the claims' owner (freshness, stamps).
        stopping: set when the worker stops.
        events: where CLAIMED is emitted.
        on_claimed: called with how many jobs each claim took (stats).
        shares: queue -> most of its jobs this worker holds at once, ready
            and running together (``--queue emails=5``): each claim of such a
            queue is cut to what is left of its share, prefetch included, so
            a slow queue cannot take every slot nor hoard jobs it cannot run.
        drain_after: burst mode: whether the worker's rescuer has finished
            a pass (may block briefly). A burst worker is not drained before
            then: jobs of dead workers that its rescuer hands back are run,
            not left behind as it exits. At most ``BURST_RESCUE_WAIT`` s.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        worker_id: str,
        settings: Settings,
        queues: Sequence[str],
        concurrency: int,
        prefetch: int | None,
        burst: bool,
        executor: Executor,
        completer: Completer,
        claims: Claims,
        stopping: threading.Event,
        events: EventBus,
        on_claimed: Callable[[int], None],
        shares: Mapping[str, int] | None = None,
        drain_after: Callable[[], bool] | None = None,
    ) -> None:
        self._backend = backend
        #: Stage jobs due by this time (aware datetime) instead of by the
        #: database's clock: ``jobkeeper.testing.drain`` pins it to its start.
        self.staged_until: datetime | None = None
        self._drain_after = drain_after
        self._drain_asked_at: float | None = None
        self._worker_id = worker_id
        self._settings = settings
        self.queues = list(queues)
        self.concurrency = concurrency
        self._fixed_prefetch = prefetch
        self._burst = burst
        self._executor = executor
        self._completer = completer
        self._claims = claims
        self._stopping = stopping
        self._events = events
        self._on_claimed = on_claimed
        self._shares = dict(shares or {})
        self._claim_seconds = 0.002  # running mean of one claim's round trip
        self._capacity = -1  # slots + prefetch as last told to the executor
        self._passes = 0
        # The last pass filled some queue's batch: claim again at once.
        self._batch_filled = False
        self._wake = threading.Event()
        # When (time.monotonic()) the producer stages next: at the latest
        # poll_interval after it last did, sooner when a job of ours is known
        # to come due (see _stage and stage_within).
        self._stage_lock = threading.Lock()
        self._stage_at = 0.0
        self._staged_at = -math.inf
        self._reconcile_needed = False
        # "Do not claim now": a stale heartbeat, outcomes not written.
        self._hold = ClaimHold(claims, completer)
        #: Our queues with a concurrency cap, as last read. The cap counts a
        #: job until its outcome is written, so their outcomes are written
        #: without lingering and their claims take no adaptive prefetch: a
        #: job waiting in our buffer holds a slot of the cap that another
        #: worker could be running.
        self.capped: frozenset[str] = frozenset()
        self._capped_read_at = -math.inf
        self._slow_checked_at = -math.inf  # name_slow_deliveries: once a second

    # -- wake-ups (any thread) -------------------------------------------------

    def wake(self) -> None:
        """Look for work now (a slot freed up, the worker is stopping)."""
        # A pending wake-up is enough (the loop clears it before it reads
        # anything); set() takes the event's lock even then, per job ended.
        if not self._wake.is_set():
            self._wake.set()

    def on_queue(self, queue: str) -> None:
        """The listener: jobs became available in ``queue``; ``"*"``: anything
        may have changed, so also stage again soon.
        """
        if queue == "*":
            with self._stage_lock:
                self._stage_at = min(self._stage_at, self._staged_at + CHANGE_RESTAGE_GAP)
        if queue == "*" or queue in self.queues:
            self._wake.set()

    def on_due(self, queue: str, seconds: float) -> None:
        """The listener: a job of ``queue`` comes due in ``seconds``."""
        if queue in self.queues:
            self.stage_within(seconds)

    def stage_within(self, seconds: float) -> None:
        """Stage within ``seconds``: a job of our queues comes due then (a
        retry we wrote, a delayed enqueue).
        """
        at = time.monotonic() + max(seconds, 0.0)
        with self._stage_lock:
            if at >= self._stage_at:
                return
            self._stage_at = at
        self._wake.set()

    # -- the loop ------------------------------------------------------------------

    def run(self) -> None:
        """Claim until the worker stops (or, in burst mode, until drained).

        Raises:
            DatabaseError: in burst mode, ``BURST_CLAIM_FAILURES`` claims in
                a row failed with an error that is not an outage.
            DatabaseUnavailable: in burst mode, the database has been
                unavailable for ``BURST_OUTAGE_WAIT`` seconds.
        """
        outage_pause = 0.05
        # When this thread first saw the outage (claims failing as
        # unavailable, or paused for a stale heartbeat), by its own clock: a
        # process paused meanwhile (SIGSTOP) does not count as one.
        outage_since: float | None = None
        failures = 0
        rerun = False  # whether this pass is a closed idle session's rerun
        while not self._stopping.is_set():
            self._wake.clear()
            # What the pass is doing, for its log lines.
            step = "claim"
            try:
                if self._reconcile_needed:
                    step = "reconciling held jobs"
                    self._reconcile()
                if time.monotonic() >= self._stage_at:
                    step = "staging due jobs"
                    self._stage()
                if time.monotonic() - self._capped_read_at >= CAPPED_RECHECK:
                    step = "reading queue settings"
                    self._read_capped()
                if self._fixed_prefetch is None:
                    step = "handing back ready jobs"
                    self._executor.hand_back(stalled_for=PREFETCH_STALL)
                now = time.monotonic()
                if now >= self._slow_checked_at + 1.0:
                    self._slow_checked_at = now
                    self._executor.name_slow_deliveries()
                step = "claim"
                claimed = self._claim()
                if self._burst and claimed == 0 and self._drained():
                    # Not "nothing left": a paused queue's jobs, or ones a
                    # rate limit or cap holds back, stay (helper-83).
                    with contextlib.suppress(Exception):  # see joblog._never_raises
                        logger.info(
                            "burst: nothing this worker may run now is due; stopping (jobs of "
                            "paused queues or held back by limits, if any, stay queued)"
                        )
                    return
                outage_pause, failures, rerun = 0.05, 0, False
                if not self._hold.paused:
                    outage_since = None
                elif outage_since is None:
                    outage_since = time.monotonic()
            except DatabaseUnavailable as exc:
                if exc.retry_asked and not rerun:
                    # The server closed the session for sitting idle as the
                    # statement went out, after the check before use: nothing
                    # of it ran, and a new session runs it.
                    logger.debug("%s: %s; running it again at once", step, exc)
                    rerun = True
                    continue
                # A claim may have committed with its reply lost: look for
                # jobs held under our id that nobody here runs once back.
                self._reconcile_needed = True
                if outage_since is None:
                    outage_since = time.monotonic()
                if self._burst:
                    stop_after_outage(outage_since, exc)
                log_unavailable(step, exc, outage_pause)
                self._stopping.wait(outage_pause)
                outage_pause = min(outage_pause * 2, 5.0)
                continue
            except DatabaseReplaced:
                raise  # the worker stops: its file is gone (see Worker._on_replaced)
            except DatabaseError as exc:
                failures += 1
                if self._burst and failures >= BURST_CLAIM_FAILURES:
                    logger.error("burst: %d claims in a row failed; stopping", failures)
                    raise
                log_failed(step, exc)
                self._stopping.wait(self._settings.poll_interval)
                continue
            if self._burst and outage_since is not None:
                # Claims paused for a stale heartbeat or unwritten outcomes:
                # no claim is made, so none fails.
                stop_after_outage(outage_since, None)
            if self._batch_filled and self._wanted() > 0:
                # A full batch came back: the queue may hold more. A short one
                # took all there was; what comes later comes with a wake-up.
                continue
            wait = max(self._stage_at - time.monotonic(), 0.0)
            if self._drain_asked_at is not None:
                # Drained but for the rescuer's first pass: nothing wakes
                # us when it ends, and the next staging may be poll_interval
                # away (a burst worker at 3600 s waited that long).
                wait = min(wait, BURST_RESCUE_RECHECK)
            self._wake.wait(wait)

    def _stage(self) -> None:
        """Stage due jobs, and set when to stage next: when the next job of our
        queues comes due (the database says in how many seconds, by its own
        clock), at the latest ``poll_interval`` from now -- the fallback for
        jobs we hear nothing about (another process's delayed enqueue where no
        wake-up reaches us, a rescued job).

        Only jobs not yet due count as next: a due job that another worker is
        staging, or has staged, gives no reason to stage again at once, so a
        wake-up for it cannot make the producer spin.
        """
        with self._stage_lock:
            # Hints that arrive while the query runs lower it again.
            was, self._stage_at = self._stage_at, math.inf
        try:
            staging = self._backend.job_stage_due(queues=self.queues, now=self.staged_until)
        except BaseException:
            with self._stage_lock:
                self._stage_at = min(self._stage_at, was)
            raise
        wait = self._settings.poll_interval
        if staging.next_due_in is not None:
            wait = min(wait, max(staging.next_due_in, 0.0))
        now = time.monotonic()
        with self._stage_lock:
            self._staged_at = now
            self._stage_at = min(self._stage_at, now + wait)

    def _read_capped(self) -> None:
        self._capped_read_at = time.monotonic()
        settings = self._backend.queue_settings_list(names=self.queues)
        self.capped = frozenset(s.name for s in settings if s.concurrency is not None)

    # -- sizing ------------------------------------------------------------------

    @property
    def prefetch_setting(self) -> int | None:
        """The fixed prefetch, or None when it adapts."""
        return self._fixed_prefetch

    @property
    def prefetch(self) -> int:
        """Jobs to hold beyond the free slots (see :meth:`_prefetch_of`)."""
        return self._prefetch_of(self._executor.snapshot())

    def _prefetch_of(self, state: ExecutorState) -> int:
        """Jobs to hold beyond the free slots.

        Adaptive unless fixed: enough to keep every slot busy for one claim's
        round trip (``concurrency x claim time / run time``), at most the
        backend's ``prefetch_per_slot`` per slot. Fast jobs get a deep buffer,
        so claims come in large batches; jobs that run longer than a claim
        takes get none, so no job waits behind a long one while another
        worker is idle, and a crash leaves only what was running to be run
        again (unstarted claims go back unspent, but only once rescued).
        The run time is the running mean, or, while every slot is busy, the
        time since a job last started if that is longer: slots held by slow
        jobs shrink the buffer before any of them finishes.
        Prefetched jobs that still wait ``PREFETCH_STALL`` seconds with no
        job starting are handed back (see :meth:`run`).
        """
        if self._fixed_prefetch is not None:
            return self._fixed_prefetch
        run_seconds = state.mean_run_seconds
        if run_seconds is None:
            return 0  # nothing known yet: claim only what fits
        if state.active >= self.concurrency:
            run_seconds = max(run_seconds, time.monotonic() - state.last_start)
        wanted = self.concurrency * self._claim_seconds / max(run_seconds, 1e-6)
        per_slot = self._backend.prefetch_per_slot
        return min(round(wanted), per_slot * self.concurrency, MAX_ADAPTIVE_PREFETCH)

    def _wanted(self) -> int:
        """Jobs to claim now: free slots plus the prefetch, less what is buffered."""
        state = self._executor.snapshot()
        return self.concurrency + self._prefetch_of(state) - state.load

    def _claim(self) -> int:
        """Claim a batch if worth it; start what fits. Returns jobs claimed.

        A claim is one round trip whatever its size, so the worker does not
        claim one job per freed slot: it claims when its buffer is empty, or
        when at least half its capacity (slots + prefetch) can be filled.
        """
        self._batch_filled = False
        if self._hold.holding():
            # Our heartbeat is stale (anything claimed now could be rescued
            # from under us at once), or what we ran cannot be written.
            return 0
        # One reading for the whole decision: each is a lock that busy
        # runners take too, and a wait for it delays the claim they await.
        state = self._executor.snapshot()
        if state.alone:
            # A crash suspect waits to run, or runs, alone (the crash
            # budget, see the slots): nothing is claimed to run beside it.
            return 0
        capacity = self.concurrency + self._prefetch_of(state)
        if capacity != self._capacity:
            self._capacity = capacity
            self._executor.set_refill_at(capacity - capacity // 2)
        wanted = capacity - state.load
        if wanted <= 0 or (state.ready and wanted < capacity // 2):
            return 0
        claimed = 0
        stamp = self._claims.stamp()  # before the query (see Claims.stamp)
        for queue in self._claim_order():
            limit = wanted - claimed
            if limit <= 0 or self._stopping.is_set():
                break
            if self._shares and queue in self._shares:
                # Only the producer adds to held_by_queue: it cannot grow meanwhile.
                limit = min(limit, self._shares[queue] - state.held_by_queue.get(queue, 0))
                if limit <= 0:
                    continue
            if queue in self.capped and self._completer.urgent_pending:
                # The cap still counts our ended jobs: a claim now would mostly
                # find it full (the completer wakes us once they are written).
                continue
            if queue in self.capped and self._fixed_prefetch is None:
                # A prefetch asked for is kept; the adaptive one is not
                # worth a slot of the cap left idle in our buffer.
                limit = min(limit, self.concurrency - state.load - claimed)
                if limit <= 0:
                    continue
            started = time.monotonic()
            jobs = self._backend.job_claim(worker_id=self._worker_id, queue=queue, limit=limit)
            self._claim_seconds += (time.monotonic() - started - self._claim_seconds) * 0.1
            if len(jobs) >= limit:
                self._batch_filled = True
            if jobs:
                self._claims.claimed(jobs, stamp)
                if self._events.wants(EventKind.CLAIMED):
                    for job in jobs:
                        self._events.emit(JobEvent.of(EventKind.CLAIMED, job))
                self._executor.offer(jobs)
                # Counted per claim: a later queue's claim that raises must
                # not leave these out of the worker's tally.
                self._on_claimed(len(jobs))
            claimed += len(jobs)
        return claimed

    def _claim_order(self) -> list[str]:
        """The queues this pass claims from, rotated so one busy queue
        cannot starve the others: by passes, not jobs claimed (a queue that
        always yields an even batch kept two queues' rotation from turning).
        Past ``PROBE_QUEUES_ABOVE``, only those holding an available job, the
        rotation turning among them: over the whole list, a queue behind a
        long run of empty ones would come first nearly every pass.
        """
        queues = self.queues
        if len(queues) > PROBE_QUEUES_ABOVE:
            queues = self._backend.queues_with_available(queues=queues)
        start = self._passes % max(len(queues), 1)
        self._passes += 1
        return queues[start:] + queues[:start]

    def _reconcile(self) -> None:
        """Hand back jobs the database says we hold but nothing here runs
        (a claim committed with its reply lost).

        Runs on the producer thread (the only one that claims), so a claim
        cannot be in flight meanwhile.
        """
        held = self._backend.job_held_by(worker_id=self._worker_id)
        known = {job.id for job in self._executor.running_jobs()} | self._completer.pending_ids()
        unknown = [job for job in held if job.id not in known]
        if unknown:
            failures = [
                released_attempt(job, "claim reply lost to a connection error; handed back")
                for job in unknown
            ]
            released = self._backend.job_fail_many(failures=failures)
            logger.warning("handed back %d jobs whose claim reply was lost", len(released))
        self._reconcile_needed = False

    def _drained(self) -> bool:
        """Burst mode: nothing running, nothing unwritten, nothing due soon,
        and the rescuer has had its pass (see ``drain_after``).
        """
        if self._executor.snapshot().load or self._completer.pending:
            return False
        if self._drain_after is not None and not self._drain_after():
            now = time.monotonic()
            if self._drain_asked_at is None:
                self._drain_asked_at = now
            if now - self._drain_asked_at < BURST_RESCUE_WAIT:
                return False
            logger.warning(
                "burst: the rescuer finished no pass in %gs; stopping without it",
                BURST_RESCUE_WAIT,
            )
            self._drain_after = None
        due_in = self._backend.job_next_due_in(queues=self.queues, now=self.staged_until)
        # On a pinned clock, a job not due by then never comes due.
        soon = self._settings.poll_interval if self.staged_until is None else 0.0
        if due_in is None or due_in > soon:
            return True
        if due_in > 0:
            self._stopping.wait(due_in)
        return False
