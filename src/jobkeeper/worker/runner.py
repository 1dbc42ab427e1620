"""The worker process: registration, services, signals and the graceful stop.

The work itself is done by the parts it wires:

- the producer (:mod:`~jobkeeper.worker.producer`, on the caller's thread):
  stages due jobs, claims as many jobs as there are free slots, and sleeps
  until a slot frees up, a wake-up arrives, or the next job comes due;
- the claims' owner (:mod:`~jobkeeper.worker.claims`): may a claimed job start;
- the executor (:mod:`~jobkeeper.worker.executor`): runs each job, sync on
  runner threads or async on its event loop, and decides its outcome;
- the completer (:mod:`~jobkeeper.worker.completer`): batched, fenced acks;
- the heartbeat, the leader, the rescuer, the pruner, the periodic enqueuer;
- the listener: the backend's wake-ups (:meth:`Backend.listen`).

Each thread has its own database connection, so none waits behind another.

SIGTERM/SIGINT: stop claiming, let running jobs finish for up to
``shutdown_grace`` seconds, interrupt the rest and hand back those whose code
returns within ``INTERRUPT_WAIT`` (available again, the attempt not spent),
flush every ack, deregister, return 0. A second signal skips the rest of the
grace period. Jobs whose code does not return even then stay held (see
:mod:`~jobkeeper.worker.stopping`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from jobkeeper import joblog
from jobkeeper.backends.base import Backend
from jobkeeper.config import Settings, is_int_between
from jobkeeper.errors import ConfigError, DatabaseError, DatabaseReplaced
from jobkeeper.events import EventBus
from jobkeeper.maintenance.heartbeat import Heartbeat
from jobkeeper.maintenance.leader import Leader
from jobkeeper.maintenance.periodic import PeriodicEnqueuer
from jobkeeper.maintenance.pruner import Pruner
from jobkeeper.maintenance.rescuer import Rescuer
from jobkeeper.maintenance.service import IntervalService
from jobkeeper.models import Claim, Failure, Job, WorkerInfo
from jobkeeper.periodic import Periodic
from jobkeeper.tasks import Task
from jobkeeper.worker.claim_hold import stop_rescued
from jobkeeper.worker.claims import Claims
from jobkeeper.worker.completer import Completer, Outcome
from jobkeeper.worker.executor import Executor
from jobkeeper.worker.exit_bound import ExitBound, stuck_after_for
from jobkeeper.worker.listener import SignalRelay, start_listener
from jobkeeper.worker.producer import MAX_PREFETCH, Producer
from jobkeeper.worker.reruns import again_if_lost
from jobkeeper.worker.schema import SchemaWatch, register_when_reachable
from jobkeeper.worker.sideeffects import SideEffects
from jobkeeper.worker.stats import WorkerStats, checked_shares, make_worker_id
from jobkeeper.worker.stopping import stop_running

logger = logging.getLogger("jobkeeper.worker")


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
            slot frees. Default ``None``: adaptive (see :attr:`Producer.prefetch`).
        periodics: the app's periodic jobs; this worker enqueues their ticks.
        events: where the worker emits its job events (``JobQueue.events``);
            a private bus when None. The worker logs every outcome through
            it (:mod:`jobkeeper.joblog`) while it runs.
        queue_shares: queue -> most of its jobs this worker runs at once
            (1..``concurrency``), prefetched ones counted: one slow queue
            cannot take every slot. Shares may add up to more than
            ``concurrency`` (each is a cap, not a reservation).

    Raises:
        ConfigError: a bad prefetch, or a share that is not an int between 1
            and ``concurrency`` or names a queue the worker does not serve.
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
        events: EventBus | None = None,
        queue_shares: Mapping[str, int] | None = None,
    ) -> None:
        self._settings = settings
        self._tasks = tasks
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.burst = burst
        if prefetch is not None and not is_int_between(prefetch, 0, MAX_PREFETCH):
            # Bounded: a huge value reached the claim's LIMIT and failed
            # there (SQLite: OverflowError; PostgreSQL: a retry loop).
            raise ConfigError(
                f"prefetch must be an int between 0 and {MAX_PREFETCH} or None, got {prefetch!r}"
            )
        self.queue_shares = checked_shares(queue_shares or {}, self.queues, concurrency)
        self.events = events if events is not None else EventBus()
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
        self._stopping = threading.Event()
        self._backend = self._dedicated("claims")
        self._force = threading.Event()
        #: When a stop was first asked (the grace period runs from it).
        self._asked_at: float | None = None
        self._exit_bound = ExitBound(self.info.id, settings.rescue_after)
        self.completer = Completer(
            self._dedicated("outcomes"),
            delete_completed=settings.retention == 0,
            on_written=self._on_written,
            events=self.events,
            # Capacity of a capped queue was freed, or a backlog of failed
            # writes was written: claim now.
            on_urgent_written=lambda: self.producer.wake(),
            on_written_again=lambda: self.producer.wake(),
        )
        #: A heartbeat younger than this (seconds) means no rescuer can have
        #: taken our claims; older, and we stop claiming and starting jobs
        #: until the database has confirmed we still hold them.
        fresh_for = settings.rescue_after / 2
        maintenance_interval = min(max(settings.rescue_after / 4, 0.05), 5.0)
        self.schema_watch = SchemaWatch(
            where=self._base_backend.url.redacted(), worker_id=self.info.id
        )
        self.heartbeat = Heartbeat(
            self._dedicated("heartbeat"),
            self.info,
            settings.heartbeat_interval,
            self._on_cancel,
            stale_after=fresh_for,
            on_holds=self._on_holds,
            on_replaced=self._on_replaced,
        )
        self.claims = Claims(
            # Not the API pool: tasks may hold every pooled connection
            # (pool_size below concurrency), and a start must not wait on them.
            backend=self._dedicated("start-checks"),
            worker_id=self.info.id,
            heartbeat=self.heartbeat,
            completer=self.completer,
            fresh_for=fresh_for,
            stopping=self._stopping,
            events=self.events,
        )
        # Not the API pool either (as the claims above).
        self.side_effects = SideEffects(self._dedicated("side-effects"), settings)
        self.executor = Executor(
            tasks=tasks,
            settings=settings,
            concurrency=concurrency,
            refill_at=concurrency - concurrency // 2,
            on_outcome=self._on_outcome,
            on_need_jobs=lambda: self.producer.wake(),
            may_start=self.claims.may_start,
            still_held=self.claims.still_held,
            on_start=self.claims.started,
            events=self.events,
            shares=self.queue_shares,
            running_job=self.side_effects.running_job,
            complete_in=self.side_effects.complete_in,
            committed_in=self.side_effects.committed_in,
        )
        self.producer = Producer(
            backend=self._backend,
            worker_id=self.info.id,
            settings=settings,
            queues=self.queues,
            concurrency=concurrency,
            prefetch=prefetch,
            burst=burst,
            executor=self.executor,
            completer=self.completer,
            claims=self.claims,
            stopping=self._stopping,
            events=self.events,
            on_claimed=self.stats.count_claimed,
            shares=self.queue_shares,
            drain_after=(lambda: self.rescuer.wait_passes(1, 0.05)) if burst else None,
        )
        self.rescuer = Rescuer(
            self._dedicated("rescuer"),
            settings,
            maintenance_interval,
            may_judge=self._may_judge,
            events=self.events,
            max_crashes_of=self._max_crashes_of,
            after_pass=self.schema_watch,
            # A burst worker hands back a dead holder's jobs in its first
            # pass, or it would call itself drained with them left held.
            settle_first=not burst,
        )
        self.leader = Leader(
            self._dedicated("leader"), self.info.id, ttl=max(3 * settings.heartbeat_interval, 1.0)
        )
        self.pruner = Pruner(
            self._dedicated("pruner"),
            settings.retention,
            max(maintenance_interval, 1.0),
            only_when=lambda: self.leader.is_leader,
            dead_retention=settings.dead_retention,
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
                self._dedicated("periodic"), periodics, refresh=settings.heartbeat_interval
            )
            self._services.append(self.periodic)
        self._listener: threading.Thread | None = None
        self._listener_stop = threading.Event()
        self._registered = False
        #: Why the worker must stop with an error (its SQLite file gone).
        self._fatal: DatabaseReplaced | None = None

    def _dedicated(self, role: str) -> Backend:
        # The worker's id in the name joins a session to its jobkeeper_workers
        # row; the role comes first, as PostgreSQL cuts names at 63 bytes.
        # Once the stop begins its calls are checked on after 1 s (exit_bound).
        backend = self._base_backend.dedicated(
            f"{role} {self.info.id}",
            stuck_after=stuck_after_for(self._settings.rescue_after),
            stopping=self._stopping,
        )
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
        if self._asked_at is None:
            self._asked_at = time.monotonic()
        self._stopping.set()
        self.producer.wake()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        # Whatever holds the stop up (a database that never answers), a
        # signalled worker ends within a bound (see exit_bound).
        self._exit_bound.signalled(self._settings.shutdown_grace, again=self._stopping.is_set())
        if self._stopping.is_set():
            logger.warning("%s again: handing back running jobs now", name)
        else:
            # Ctrl-C at a terminal sends SIGINT: say what a second one does,
            # or people reach for kill -9 (and lose the hand-back).
            again = "Ctrl-C" if signum == signal.SIGINT else name
            with contextlib.suppress(Exception):  # a broken log handler must not stop the stop
                logger.info(
                    "%s: stopping; running jobs get up to %ss to finish (%s again forces the "
                    "stop: running jobs are handed back at once)",
                    name,
                    self._settings.shutdown_grace,
                    again,
                )
        self.stop()

    def _on_outcome(self, job: Job, outcome: Outcome) -> None:
        self.claims.forget(job)
        # A capped queue's slot, or a serial key, is held until the outcome
        # is written: written at once, the next job of either is claimed at
        # once rather than at the next poll.
        urgent = job.queue in self.producer.capped or job.serial_key is not None
        self.completer.add(outcome, job=job, urgent=urgent)

    def _max_crashes_of(self, job: Job) -> int:
        """A job's crash budget: its task's ``max_crashes`` here, else the setting."""
        task = self._tasks.get(job.task)
        if task is not None and task.max_crashes is not None:
            return task.max_crashes
        return self._settings.max_crashes

    def _may_judge(self, window: float) -> bool:
        """Whether our rescuer may declare other workers dead: not while our
        own heartbeat writes fail or wait on the database, nor for ``window``
        seconds after (the judged holder's rescue_after, at least our own).
        Whatever held them up (a database outage, SQLite's write lock held by
        a stopped process) held up the others' alike; a rescue then would
        take jobs from live workers.
        """
        return not self.heartbeat.troubled_within(max(window, self._settings.rescue_after))

    def _on_holds(self, held: list[Job], spells: int) -> None:
        stop_rescued(self.executor, self.claims, held, spells)

    def _on_replaced(self, exc: DatabaseReplaced) -> None:
        """The SQLite file was removed or replaced under us: stop at once,
        ``run`` raises it (exit 1). Every job we hold is in the removed file;
        a worker (re)started on the new one serves it.
        """
        if self._fatal is None:
            self._fatal = exc
            logger.error(
                "worker %s: %s -- stopping now (its jobs are in the removed file); "
                "start a worker again once the database is back (`jobkeeper migrate` "
                "creates a new one)",
                self.info.id,
                exc,
            )
        self.stop(force=True)

    def _on_cancel(self, claim: Claim) -> None:
        if self.executor.cancel(claim, "cancelled while running"):
            logger.info("job %s: cancel requested; asked its code to stop", claim.job_id)

    def _on_written(self, batch: list[Outcome], written: set[int]) -> None:
        self.executor.settled(batch)
        self.stats.count_written(batch, written)
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
            self.producer.stage_within(min(retry_ins))

    # -- run ----------------------------------------------------------------

    def run(self) -> WorkerStats:
        """Run until stopped (or, with ``burst``, until the queues are drained).

        Installs SIGTERM/SIGINT handlers when called from the main thread.

        A worker started while the database is unreachable waits for it,
        retrying with backoff (up to ``schema.STARTUP_RETRY_MAX`` seconds apart) and
        logging each failure, the way a worker started beside its database
        (docker-compose, a reboot) should; SIGTERM/SIGINT meanwhile ends it
        cleanly. A ``burst`` worker is for scripts and fails at once instead.
        What waiting does not fix stops the start at once, logged and
        raised: a database, role or password the server refuses
        (``DatabaseRefused``), a search path naming no schema that exists,
        a schema not migrated, a SQLite file that is missing or no database.
        Once started, the worker waits out every outage, whatever it says.

        Raises:
            DatabaseRefused: the server (or a pooler) refused the URL's
                connection for a reason that waiting does not fix.
            DatabaseUnavailable: with ``burst``, the database cannot be
                reached at start.
            DatabaseError: the schema is behind this code's (run
                ``jobkeeper migrate``), or not there at all; or its SQLite
                file was removed or replaced as it ran (``_on_replaced``).
        """
        signals = SignalRelay(self._on_signal)
        signals.install()
        stop_logging = joblog.install(self.events)
        try:
            where = self._base_backend.url.redacted()
            self._registered = register_when_reachable(
                self._backend, self.info, where=where, burst=self.burst, stopping=self._stopping
            )
            if not self._registered:
                return self.stats
            self.heartbeat.note_beat()
            self.completer.warm()
            self._read_installation()
            joblog.log_start(
                worker_id=self.info.id,
                database=self._base_backend.url.redacted(),
                queues=self.queues,
                concurrency=self.concurrency,
                prefetch=self.producer.prefetch_setting,
                settings=self._settings,
                tasks=self._tasks,
            )
            for service in self._services:
                service.start()
            self._start_listener()
            self.producer.run()
            if self._fatal is not None:
                raise self._fatal
        except Exception as exc:
            if isinstance(exc, DatabaseReplaced):  # a claim found it first
                self._on_replaced(exc)
            joblog.log_stopped_on_error(worker_id=self.info.id, error=exc)
            raise
        finally:
            try:
                self._shutdown()
            finally:
                self._exit_bound.done()
            signals.restore()
            stop_logging()
        return self.stats

    def _read_installation(self) -> None:
        """Read the idempotency keys' installation value before any job runs."""
        try:
            self.side_effects.installation()
        except DatabaseError as exc:
            logger.warning("could not read the installation value (%s); retrying later", exc)

    def _start_listener(self) -> None:
        """The backend's wake-ups, on their own thread and connection."""
        self._listener = start_listener(
            self._base_backend.dedicated(
                f"listener {self.info.id}",
                stuck_after=stuck_after_for(self._settings.rescue_after),
                stopping=self._stopping,
            ),
            self.producer,
            self._listener_stop,
        )

    # -- shutdown -----------------------------------------------------------

    def _shutdown(self) -> None:
        self._stopping.set()
        # A stopping worker leads nothing: resigned now, the lease goes to a
        # worker that stays instead of waiting out the grace period (not in
        # a removed file: nothing can be written there, nor waits on it).
        gone = None if self._fatal is None else self._fatal.path
        self.leader.stop(resign=gone is None)
        stopped = stop_running(
            self.executor,
            self.completer,
            self._backend,
            grace=self._settings.shutdown_grace,
            since=self._asked_at,
            force=self._force,
            rescue_after=self._settings.rescue_after,
            gone=gone,
        )
        self._listener_stop.set()
        for service in reversed(self._services):
            service.stop()
        if self._listener is not None:
            self._listener.join(timeout=2)
        if not stopped.flushed or stopped.stuck:
            self.stats.exit_code = 1
        try:
            # Without our row, anything we still hold (unwritten acks) is
            # rescued by the next rescuer pass instead of after rescue_after.
            # Not while code we gave up on may still run in this process: its
            # job is rescued rescue_after seconds after our last heartbeat.
            if self._registered and not stopped.stuck and gone is None:
                deregister = self._backend.worker_deregister
                again_if_lost(lambda: deregister(worker_id=self.info.id))
        except DatabaseError as exc:
            logger.warning("could not deregister (%s); the row will go stale and be pruned", exc)
        self.executor.close()
        for backend in self._backends:
            backend.close()
        joblog.log_stop(
            worker_id=self.info.id,
            started=self._registered,
            tally=self.stats,
            left_held=stopped.left_held,
        )
