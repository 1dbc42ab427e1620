"""The worker process: register, claim, execute, acknowledge, stop gracefully.

Threads, each with its own database connection so none waits behind another
(C-14):

- the producer (the caller's thread): stages due jobs, claims as many jobs as
  there are free slots, and sleeps until a slot frees up, a wake-up arrives
  (LISTEN/NOTIFY on PostgreSQL; an in-process signal or a change of SQLite's
  ``data_version`` otherwise), the next job of its queues comes due, or
  ``poll_interval`` passes (see :meth:`Worker._stage`);
- the executor's task threads and event loop;
- the completer (batched, fenced acks);
- the heartbeat, the rescuer and the pruner;
- on PostgreSQL, the listener.

SIGTERM/SIGINT: stop claiming, let running jobs finish for up to
``shutdown_grace`` seconds, interrupt the rest and hand back those whose code
returns within ``INTERRUPT_WAIT`` (available again, the attempt not spent),
flush every ack, deregister, return 0. A second signal skips the rest of the
grace period. Jobs whose code does not return even then stay held (see
:meth:`Worker._shutdown`).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from jobkeeper.backends.base import Backend
from jobkeeper.config import Settings
from jobkeeper.errors import ConfigError, DatabaseError, DatabaseUnavailable
from jobkeeper.maintenance.heartbeat import Heartbeat
from jobkeeper.maintenance.leader import Leader
from jobkeeper.maintenance.periodic import PeriodicEnqueuer
from jobkeeper.maintenance.pruner import Pruner
from jobkeeper.maintenance.rescuer import Rescuer
from jobkeeper.maintenance.service import IntervalService
from jobkeeper.models import Claim, Completion, Failure, Job, Start, WorkerInfo
from jobkeeper.outcomes import claim_of, released_attempt
from jobkeeper.periodic import Periodic
from jobkeeper.tasks import Task
from jobkeeper.worker.completer import Completer, Outcome
from jobkeeper.worker.executor import Executor

logger = logging.getLogger("jobkeeper.worker")

#: How often an idle SQLite worker checks ``data_version`` for commits by
#: other processes, in seconds. The check reads a counter in the WAL's shared
#: memory (a few microseconds, no I/O), so a short period buys a pickup
#: latency of about half of it for next to no CPU.
SQLITE_CHANGE_POLL = 0.01
#: Least time, in seconds, from one staging to the next one prompted by a
#: SQLite commit of another connection (it may have been a delayed enqueue by
#: another process, which sends no wake-up). Commits can come by the thousand:
#: this bounds the extra stagings (each a lock-free read) to ten a second.
CHANGE_RESTAGE_GAP = 0.1
#: Most jobs a worker may hold beyond its free slots (``prefetch``).
MAX_PREFETCH = 10_000
#: The adaptive prefetch holds at most this many jobs per slot, and at most
#: ``MAX_ADAPTIVE_PREFETCH`` in all: about what the raw-SQL limit needs (claims
#: of ~100 rows) at the default concurrency of 10.
PREFETCH_PER_SLOT = 10
MAX_ADAPTIVE_PREFETCH = 1_000
#: Seconds without a job starting, every slot busy, after which an adaptive
#: worker hands its prefetched jobs back (``Executor.hand_back_waiting``).
PREFETCH_STALL = 1.0
#: Longest wait, in seconds, between attempts to reach the database at start.
STARTUP_RETRY_MAX = 10.0
#: Seconds a stopping worker waits, after interrupting the jobs still running
#: past the grace period, for their code to return.
INTERRUPT_WAIT = 2.0
#: Seconds a stop gives unwritten outcomes beyond what is left of the grace
#: period. Enough for acks to reach a healthy (or just restarted) server; not
#: a wait without end on one that refuses writes (read-only, out of disk):
#: what is still unwritten then is rescued and run again (at-least-once).
SHUTDOWN_FLUSH = 3.0


def make_worker_id() -> str:
    """``host:pid:random``: the random part means a restarted process with the
    same host name and pid (a container's PID 1) never inherits a dead run's
    liveness (procrastinate#1518).
    """
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass
class WorkerStats:
    """What one worker did (returned by :meth:`Worker.run`)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    lost_claims: int = 0
    released: int = 0
    exit_code: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


class Worker:
    """One worker: see the module docstring.

    Args:
        backend: the queue's backend; the worker opens dedicated ones from it.
        tasks: the task registry, name -> Task.
        settings: timings and limits.
        queues: queue names to claim from.
        concurrency: most jobs running at once.
        burst: exit once nothing is available or due within ``poll_interval``.
        prefetch: jobs claimed beyond the free slots, to start the moment a
            slot frees. Default ``None``: adaptive (see :meth:`prefetch`).
        periodics: the app's periodic jobs; this worker enqueues their ticks.
    """

    def __init__(
        self,
        backend: Backend,
        tasks: Mapping[str, Task[Any, Any]],
        settings: Settings,
        *,
        queues: Sequence[str],
        concurrency: int,
        burst: bool = False,
        prefetch: int | None = None,
        periodics: Sequence[Periodic] = (),
    ) -> None:
        self._settings = settings
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.burst = burst
        if prefetch is not None and (
            isinstance(prefetch, bool)
            or not isinstance(prefetch, int)
            or not 0 <= prefetch <= MAX_PREFETCH
        ):
            # Bounded: a huge value reached the claim's LIMIT and failed
            # there (SQLite: OverflowError; PostgreSQL: a retry loop).
            raise ConfigError(
                f"prefetch must be an int between 0 and {MAX_PREFETCH} or None, got {prefetch!r}"
            )
        self._fixed_prefetch = prefetch
        self._claim_seconds = 0.002  # running mean of one claim's round trip
        self.info = WorkerInfo(
            id=make_worker_id(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=self.queues,
            started_at=datetime.now(UTC),
            heartbeat_at=datetime.now(UTC),
            rescue_after=settings.rescue_after,
        )
        self.stats = WorkerStats()
        self._base_backend = backend
        self._backends: list[Backend] = []
        self._backend = self._dedicated()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._force = threading.Event()
        self._stats_lock = threading.Lock()
        # When (time.monotonic()) the producer stages next: at the latest
        # poll_interval after it last did, sooner when a job of ours is known
        # to come due (see _stage and _stage_within).
        self._stage_lock = threading.Lock()
        self._stage_at = 0.0
        self._staged_at = -math.inf
        self._staged_counter: int | None = None
        self.completer = Completer(
            self._dedicated(),
            delete_completed=settings.retention == 0,
            on_written=self._on_written,
        )
        self.executor = Executor(
            tasks=tasks,
            settings=settings,
            concurrency=concurrency,
            refill_at=concurrency - concurrency // 2,
            on_outcome=self._on_outcome,
            on_need_jobs=self._wake.set,
            may_start=self._may_start,
            still_held=self._still_held,
            on_start=self._on_start,
        )
        #: A heartbeat younger than this (seconds) means no rescuer can have
        #: taken our claims; older, and we stop claiming and starting jobs
        #: until the database has confirmed we still hold them.
        self._fresh_for = settings.rescue_after / 2
        maintenance_interval = min(max(settings.rescue_after / 4, 0.05), 5.0)
        self.heartbeat = Heartbeat(
            self._dedicated(),
            self.info,
            settings.heartbeat_interval,
            self._on_cancel,
            stale_after=self._fresh_for,
        )
        # Job id -> the heartbeat's stale_spells when it was claimed.
        self._claim_spells: dict[int, int] = {}
        self.rescuer = Rescuer(
            self._dedicated(), settings, maintenance_interval, may_judge=self._may_judge
        )
        self.leader = Leader(
            self._dedicated(), self.info.id, ttl=max(3 * settings.heartbeat_interval, 1.0)
        )
        self.pruner = Pruner(
            self._dedicated(),
            settings.retention,
            max(maintenance_interval, 1.0),
            only_when=lambda: self.leader.is_leader,
        )
        #: Started in this order, stopped in the reverse one.
        self._services: list[IntervalService] = [
            self.heartbeat,
            self.leader,
            self.rescuer,
            self.pruner,
        ]
        if periodics:
            # Every worker of the app, not only the leader: the database
            # decides which insert of a tick wins.
            self.periodic = PeriodicEnqueuer(
                self._dedicated(), periodics, refresh=settings.heartbeat_interval
            )
            self._services.append(self.periodic)
        self._listener: threading.Thread | None = None
        self._listener_stop = threading.Event()
        self._reconcile_needed = False
        self._claims_paused = False
        self._registered = False

    def _dedicated(self) -> Backend:
        backend = self._base_backend.dedicated()
        self._backends.append(backend)
        return backend

    # -- control ------------------------------------------------------------

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop (thread-safe; what a signal does).

        Args:
            force: skip what is left of the grace period.
        """
        if self._stopping.is_set() or force:
            self._force.set()
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._stopping.is_set():
            logger.warning("%s again: handing back running jobs now", name)
        else:
            logger.info(
                "%s: stopping; running jobs get up to %ss to finish",
                name,
                self._settings.shutdown_grace,
            )
        self.stop()

    def _may_start(self, job: Job) -> bool:
        """Whether a claimed job may start (the executor asks, from a runner thread).

        Yes at once while our heartbeat is fresh and has been since the claim:
        no rescuer can have taken it. After a stale spell (a paused process, a
        database outage; even one the heartbeat has already recovered from)
        the claim may have been rescued and the job be running elsewhere, or
        be done: wait for a fresh heartbeat, then ask the database whether we
        still hold it. False: the claim is lost, or the worker is stopping.
        """
        if self._still_held(job):
            return True
        while not self._stopping.is_set():
            if self.heartbeat.beat_age() <= self._fresh_for:
                spell = self.heartbeat.stale_spells  # the age first, as in _still_held
                try:
                    held = self._base_backend.job_held_by(worker_id=self.info.id)
                except DatabaseError:
                    self._stopping.wait(0.1)
                    continue
                if any(h.id == job.id and h.fence == job.fence for h in held):
                    # Confirmed as of a fresh heartbeat: the executor's last
                    # check before the call (_still_held) now counts from here.
                    self._claim_spells[job.id] = spell
                    return True
                return False
            self._stopping.wait(0.05)
        return False

    def _still_held(self, job: Job) -> bool:
        """Whether our heartbeat is fresh and has been since the job was
        claimed (or its hold last confirmed): then no rescuer can have taken
        it. Never blocks; the executor asks again just before calling the task.
        """
        # The age first: the heartbeat counts a spell before it updates the age.
        return (
            self.heartbeat.beat_age() <= self._fresh_for
            and self.heartbeat.stale_spells == self._claim_spells.get(job.id)
        )

    def _on_start(self, job: Job) -> None:
        """The task of a claimed job is being called: record its start mark
        (claimed -> running), batched with the outcomes.

        A job whose earlier claim was lost before its start was recorded may
        be one that kills its worker as it starts (C-05): its mark is written
        before the task is called, so such a crash spends an attempt from the
        second one on. One round trip, only for those jobs.
        """
        claim = claim_of(job)
        if job.unstarted_returns:
            try:
                self._base_backend.job_start_many([claim])
                return
            except DatabaseError as exc:
                logger.warning("job %s: start mark not written now (%s)", job.id, exc)
        self.completer.add(Start(claim))

    def _on_outcome(self, outcome: Outcome) -> None:
        self._claim_spells.pop(outcome.claim.job_id, None)
        self.completer.add(outcome)

    def _may_judge(self, window: float) -> bool:
        """Whether our rescuer may declare other workers dead: not while our
        own heartbeat writes fail or wait on the database, nor for ``window``
        seconds after (the judged holder's rescue_after, at least our own).
        Whatever held them up (a database outage, SQLite's write lock held by
        a stopped process) held up the others' alike; a rescue then would
        take jobs from live workers (the soak caught it on SQLite).
        """
        return not self.heartbeat.troubled_within(max(window, self._settings.rescue_after))

    def _on_cancel(self, claim: Claim) -> None:
        if self.executor.cancel(claim, "cancelled while running"):
            logger.info("job %s: cancel requested; asked its code to stop", claim.job_id)

    def _on_queue(self, queue: str) -> None:
        if queue == "*" or queue in self.queues:
            self._wake.set()

    def _on_due(self, queue: str, seconds: float) -> None:
        """A job of ``queue`` was enqueued to come due in ``seconds`` (NOTIFY)."""
        if queue in self.queues:
            self._stage_within(seconds)

    def _on_written(self, batch: list[Outcome], written: set[int]) -> None:
        self._count_written(batch, written)
        # A retry or snooze we wrote comes due retry_in seconds from now (the database
        # computed its scheduled_at as of the write, just done): no other
        # wake-up will come for it.
        retry_ins = [
            outcome.retry_in
            for outcome in batch
            if isinstance(outcome, Failure)
            and outcome.outcome in ("retryable", "snoozed")
            and outcome.claim.job_id in written
        ]
        if retry_ins:
            self._stage_within(min(retry_ins))

    def _count_written(self, batch: list[Outcome], written: set[int]) -> None:
        with self._stats_lock:
            for outcome in batch:
                if outcome.claim.job_id not in written:
                    self.stats.lost_claims += 1
                    continue
                kind = "completed" if isinstance(outcome, Completion) else outcome.outcome
                self.stats.by_outcome[kind] = self.stats.by_outcome.get(kind, 0) + 1
                if kind == "completed":
                    self.stats.completed += 1
                elif kind == "released":
                    self.stats.released += 1
                else:
                    self.stats.failed += 1

    # -- run ----------------------------------------------------------------

    def run(self) -> WorkerStats:
        """Run until stopped (or, with ``burst``, until the queues are drained).

        Installs SIGTERM/SIGINT handlers when called from the main thread.

        A worker started while the database is unreachable waits for it,
        retrying with backoff (up to ``STARTUP_RETRY_MAX`` seconds apart) and
        logging each failure, the way a worker started beside its database
        (docker-compose, a reboot) should; SIGTERM/SIGINT meanwhile ends it
        cleanly. A ``burst`` worker is for scripts and fails at once instead.

        Raises:
            DatabaseUnavailable: with ``burst``, the database cannot be
                reached at start.
        """
        previous = self._install_signals()
        try:
            if not self._register_when_reachable():
                return self.stats
            self.heartbeat.note_beat()
            logger.info(
                "worker %s started: queues=%s concurrency=%d",
                self.info.id,
                ",".join(self.queues),
                self.concurrency,
            )
            for service in self._services:
                service.start()
            self._start_wakeups()
            self._produce()
        finally:
            self._shutdown()
            self._restore_signals(previous)
        return self.stats

    def _register_when_reachable(self) -> bool:
        """Register this worker, waiting out an unreachable database (not in
        burst mode). Returns False if told to stop before it could.
        """
        delay = 0.5
        while True:
            try:
                self._backend.worker_register(self.info)
            except DatabaseUnavailable as exc:
                if self.burst:
                    raise
                logger.warning("database unavailable at start (%s); retrying in %.1fs", exc, delay)
                if self._stopping.wait(delay):
                    return False
                delay = min(delay * 2, STARTUP_RETRY_MAX)
                continue
            self._registered = True
            return True

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _start_wakeups(self) -> None:
        if self._backend.supports_listen:
            listener_backend = self._base_backend.dedicated()

            def listen() -> None:
                try:
                    listener_backend.listen(
                        self._on_queue, self._listener_stop, on_due=self._on_due
                    )
                finally:
                    listener_backend.close()

            self._listener = threading.Thread(target=listen, name="jobkeeper-listener", daemon=True)
            self._listener.start()
        else:
            add = getattr(self._base_backend, "add_local_listener", None)
            if add is not None:
                add(self._wake)

    def _produce(self) -> None:
        settings = self._settings
        outage_pause = 0.05
        while not self._stopping.is_set():
            self._wake.clear()
            claimed = 0
            try:
                if self._reconcile_needed:
                    self._release_unknown_claims()
                if time.monotonic() >= self._stage_at:
                    self._stage()
                if self._fixed_prefetch is None:
                    self.executor.hand_back_waiting(PREFETCH_STALL)
                claimed = self._claim()
                if self.burst and claimed == 0 and self._drained():
                    logger.info("burst: nothing left to run; stopping")
                    return
                outage_pause = 0.05
            except DatabaseUnavailable as exc:
                # A claim may have committed with its reply lost: look for
                # jobs held under our id that nobody here runs once back.
                self._reconcile_needed = True
                logger.warning("database unavailable (%s); retrying in %.2fs", exc, outage_pause)
                self._stopping.wait(outage_pause)
                outage_pause = min(outage_pause * 2, 5.0)
                continue
            except DatabaseError:
                logger.exception("claim failed; retrying")
                self._stopping.wait(settings.poll_interval)
                continue
            if claimed and self._wanted() > 0:
                continue  # a full batch came back: the queue may hold more
            self._idle_wait()

    def _stage(self) -> None:
        """Stage due jobs, and set when to stage next: when the next job of our
        queues comes due (the database says in how many seconds, by its own
        clock), at the latest ``poll_interval`` from now -- the fallback for
        jobs we hear nothing about (another process's delayed enqueue where no
        NOTIFY reaches us, a rescued job).

        Only jobs not yet due count as next: a due job that another worker is
        staging, or has staged, gives no reason to stage again at once, so a
        wake-up for it cannot make the producer spin.
        """
        with self._stage_lock:
            # Hints that arrive while the query runs lower it again.
            was, self._stage_at = self._stage_at, math.inf
        try:
            self._staged_counter = self._backend.change_counter()
            staging = self._backend.job_stage_due(queues=self.queues)
        except BaseException:
            with self._stage_lock:
                self._stage_at = min(self._stage_at, was)
            raise
        wait = self._settings.poll_interval
        if staging.next_due_in is not None:
            wait = min(wait, max(staging.next_due_in, 0.0))
        now = time.monotonic()
        self._staged_at = now
        with self._stage_lock:
            self._stage_at = min(self._stage_at, now + wait)

    def _stage_within(self, seconds: float) -> None:
        """Have the producer stage within ``seconds`` (thread-safe): a job of
        our queues comes due then (a retry we wrote, a delayed enqueue).
        """
        at = time.monotonic() + max(seconds, 0.0)
        with self._stage_lock:
            if at >= self._stage_at:
                return
            self._stage_at = at
        self._wake.set()

    def _until_stage(self) -> float:
        return max(self._stage_at - time.monotonic(), 0.0)

    @property
    def prefetch(self) -> int:
        """Jobs to hold beyond the free slots.

        Adaptive unless fixed: enough to keep every slot busy for one claim's
        round trip (``concurrency x claim time / run time``), at most
        ``PREFETCH_PER_SLOT`` per slot. Fast jobs get a deep buffer, so claims
        come in large batches; jobs that run longer than a claim takes get
        none, so no job waits behind a long one while another worker is idle,
        and a crash (which costs every claimed job an attempt) takes only what
        was running. The run time is the running mean, or, while every slot
        is busy, the time since a job last started if that is longer: slots
        held by slow jobs shrink the buffer before any of them finishes.
        Prefetched jobs that still wait ``PREFETCH_STALL`` seconds with no
        job starting are handed back (see :meth:`_produce`).
        """
        if self._fixed_prefetch is not None:
            return self._fixed_prefetch
        executor = self.executor
        run_seconds = executor.mean_run_seconds
        if run_seconds is None:
            return 0  # nothing known yet: claim only what fits
        if executor.active >= self.concurrency:
            run_seconds = max(run_seconds, time.monotonic() - executor.last_start)
        wanted = self.concurrency * self._claim_seconds / max(run_seconds, 1e-6)
        return min(round(wanted), PREFETCH_PER_SLOT * self.concurrency, MAX_ADAPTIVE_PREFETCH)

    def _wanted(self) -> int:
        """Jobs to claim now: free slots plus the prefetch, less what is buffered."""
        return self.concurrency + self.prefetch - self.executor.load()

    def _claim(self) -> int:
        """Claim a batch if worth it; start what fits. Returns jobs claimed.

        A claim is one round trip whatever its size, so the worker does not
        claim one job per freed slot: it claims when its buffer is empty, or
        when at least half its capacity (slots + prefetch) can be filled.
        """
        if self.heartbeat.beat_age() > self._fresh_for:
            # Our heartbeat is stale (database trouble, a paused process):
            # anything claimed now could be rescued from under us at once.
            if not self._claims_paused:
                logger.warning(
                    "no heartbeat acknowledged for %.1fs; not claiming until one is",
                    self.heartbeat.beat_age(),
                )
            self._claims_paused = True
            return 0
        self._claims_paused = False
        prefetch = self.prefetch
        capacity = self.concurrency + prefetch
        self.executor.refill_at = capacity - capacity // 2
        wanted = capacity - self.executor.load()
        if wanted <= 0 or (self.executor.ready_count and wanted < capacity // 2):
            return 0
        claimed = 0
        spell = self.heartbeat.stale_spells  # read before claiming (see _may_start)
        # Rotate the starting queue so one busy queue cannot starve the others.
        start = self.stats.claimed % max(len(self.queues), 1)
        for queue in self.queues[start:] + self.queues[:start]:
            limit = wanted - claimed
            if limit <= 0 or self._stopping.is_set():
                break
            started = time.monotonic()
            jobs = self._backend.job_claim(worker_id=self.info.id, queue=queue, limit=limit)
            self._claim_seconds += (time.monotonic() - started - self._claim_seconds) * 0.1
            if jobs:
                for job in jobs:
                    self._claim_spells[job.id] = spell
                self.executor.offer(jobs)
            claimed += len(jobs)
        with self._stats_lock:
            self.stats.claimed += claimed
        return claimed

    def _release_unknown_claims(self) -> None:
        """Hand back jobs the database says we hold but nothing here runs.

        Runs on the producer thread (the only one that claims), so a claim
        cannot be in flight meanwhile.
        """
        held = self._backend.job_held_by(worker_id=self.info.id)
        known = {job.id for job in self.executor.running_jobs()} | self.completer.pending_ids()
        unknown = [job for job in held if job.id not in known]
        if unknown:
            failures = [
                released_attempt(job, "claim reply lost to a connection error; handed back")
                for job in unknown
            ]
            released = self._backend.job_fail_many(failures)
            logger.warning("handed back %d jobs whose claim reply was lost", len(released))
        self._reconcile_needed = False

    def _drained(self) -> bool:
        """Burst mode: nothing running, nothing unwritten, nothing due soon."""
        if self.executor.load() or self.completer.pending:
            return False
        due_in = self._backend.job_next_due_in(queues=self.queues)
        if due_in is None or due_in > self._settings.poll_interval:
            return True
        if due_in > 0:
            self._stopping.wait(due_in)
        return False

    def _idle_wait(self) -> None:
        """Sleep until woken, or until it is time to stage (see :meth:`_stage`)."""
        counter = self._backend.change_counter()
        if counter is None:
            self._wake.wait(self._until_stage())
            return
        # SQLite: commits by other processes show up as a new data_version.
        if counter != self._staged_counter:
            # Something was committed since we staged: perhaps a delayed job
            # by another process, which sends no wake-up. Stage again soon
            # to learn its due time.
            with self._stage_lock:
                self._stage_at = min(self._stage_at, self._staged_at + CHANGE_RESTAGE_GAP)
        while not self._wake.is_set():
            remaining = self._until_stage()
            if remaining <= 0:
                return
            if self._wake.wait(min(remaining, SQLITE_CHANGE_POLL)):
                return
            try:
                if self._backend.change_counter() != counter:
                    return
            except DatabaseError:
                return

    # -- shutdown -----------------------------------------------------------

    def _shutdown(self) -> None:
        self._stopping.set()
        # Claimed but never started: handed back at once, with no errors
        # entry (with a deep prefetch a stop would add one to every buffered job).
        self.executor.stop_starting()
        grace = self._settings.shutdown_grace
        deadline = time.monotonic() + grace
        while self.executor.active and not self._force.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.executor.wait_idle(min(remaining, 0.1))
        stuck = self._interrupt_running(grace) if self.executor.active else []
        flush_for = SHUTDOWN_FLUSH if self._force.is_set() else deadline - time.monotonic()
        flushed = self.completer.stop(timeout=max(flush_for, SHUTDOWN_FLUSH))
        self._listener_stop.set()
        remove = getattr(self._base_backend, "remove_local_listener", None)
        if remove is not None:
            remove(self._wake)
        for service in reversed(self._services):
            service.stop()
        if self._listener is not None:
            self._listener.join(timeout=2)
        if not flushed or stuck:
            self.stats.exit_code = 1
        try:
            # Without our row, anything we still hold (unwritten acks) is
            # rescued by the next rescuer pass instead of after rescue_after.
            # Not while code we gave up on may still run in this process: its
            # job is rescued rescue_after seconds after our last heartbeat,
            # by when a CLI worker process has exited.
            if self._registered and not stuck:
                self._backend.worker_deregister(self.info.id)
        except DatabaseError as exc:
            logger.warning("could not deregister (%s); the row will go stale and be pruned", exc)
        self.executor.close()
        for backend in self._backends:
            backend.close()
        logger.info(
            "worker %s stopped: %d claimed, %d completed, %d failed, %d handed back, %d left held",
            self.info.id,
            self.stats.claimed,
            self.stats.completed,
            self.stats.failed,
            self.stats.released,
            len(stuck),
        )

    def _interrupt_running(self, grace: float) -> list[Job]:
        """Past the grace period: interrupt what still runs, wait up to
        ``INTERRUPT_WAIT`` seconds for its code to return (handed back then),
        and give up on the rest. Returns the jobs given up on.

        Those are not handed back: another worker would start them while
        their code still runs here (two live holders). They stay held by
        this worker; once its heartbeat stops they are rescued after
        ``rescue_after`` (the attempt counted), as if it had crashed.
        """
        asked = self.executor.interrupt_all(
            "worker shutdown: handed back at once (stop forced by a second signal)"
            if self._force.is_set()
            else f"worker shutdown: handed back after shutdown_grace={grace:g}s"
        )
        logger.warning("interrupting %d jobs still running at shutdown", asked)
        self.executor.wait_idle(INTERRUPT_WAIT)
        stuck = self.executor.abandon_running()
        if stuck:
            logger.error(
                "%d jobs did not return %gs after being interrupted at shutdown and stay held "
                "by this worker, to be rescued %gs after its last heartbeat (not handed back: "
                "their code may still be running): %s",
                len(stuck),
                INTERRUPT_WAIT,
                self._settings.rescue_after,
                ", ".join(f"{job.id} ({job.task})" for job in stuck),
            )
        return stuck
