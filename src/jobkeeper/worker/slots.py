"""The executor's slots: claimed jobs waiting to start (ready), the
executions running, and the runner threads that move one to the other.

Up to ``concurrency`` runner threads pull from the ready queue; a runner that
finishes a job goes straight on to the next one, with no thread hand-off.
The producer fills the ready queue in batches and is woken (``on_need_jobs``)
only when it runs low. One lock guards it all (see ``delivered`` for the one
write without it); others read one frozen :class:`ExecutorState`.

Jobs marked ``run_alone`` (rescued from a worker that went silent while
running them: crash suspects, see :mod:`jobkeeper.maintenance.rescuer`) wait
in a ready queue of their own and start only when nothing else runs and
every outcome of this worker is written (:meth:`Slots.settled`); while one
runs, and until its own outcome is written, nothing else starts, and the
other suspects still waiting are handed back (:attr:`Execution.beside`) for
other workers to run, alone too. So a crash during a lone attempt is pinned
on its job (an outcome still unwritten at a crash would take the blame).
The producer claims nothing while one is held (``ExecutorState.alone``).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import dataclasses
import itertools
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jobkeeper.models import Job

#: Seconds an idle runner thread waits for work before it exits.
RUNNER_IDLE_EXIT = 60.0
#: ``ExecutorState.held_by_queue`` of a worker without queue shares.
NO_HELD: Mapping[str, int] = types.MappingProxyType({})


def raise_in_thread(thread_id: int, exc_type: type[BaseException] | None) -> None:
    """Schedule ``exc_type`` in another thread (``None`` clears a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None
    )


class Execution:
    """One attempt of one job in this worker.

    ``timed_out``, ``cancel_reason`` and ``release_reason`` record what asked
    the code to stop; the outcome is built from them once it has returned.
    """

    __slots__ = (
        "alone",
        "async_task",
        "beside",
        "cancel_reason",
        "completed_in",
        "deadline",
        "done",
        "finished",
        "in_user_code",
        "interrupted",
        "job",
        "lock",
        "past_timeout_warnings",
        "release_reason",
        "started",
        "thread_id",
        "timed_out",
        "timeout",
        "wake",
    )

    def __init__(self, job: Job, timeout: float | None) -> None:
        self.job = job
        self.timeout = timeout
        #: ``time.monotonic()`` when the task was called plus ``timeout``.
        self.deadline: float | None = None
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.finished = False
        self.in_user_code = False
        self.interrupted = False
        self.timed_out = False
        #: Warnings logged that the code has not returned past its timeout.
        self.past_timeout_warnings = 0
        self.cancel_reason: str | None = None
        self.release_reason: str | None = None
        self.thread_id: int | None = None
        self.async_task: asyncio.Task[Any] | None = None
        self.done: threading.Event | None = None
        #: complete_in() succeeded (committed or not: the outcome write finds out).
        self.completed_in = False
        #: Started alone (a ``run_alone`` job): nothing else runs meanwhile.
        self.alone = False
        #: Suspects taken as this one started alone: handed back before its call.
        self.beside: list[Job] = []
        #: What ends a running sync task's ``time.sleep`` early (see sleeps).
        self.wake: threading.Lock | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutorState:
    """What the executor is doing, as of one instant.

    Attributes:
        active: executions whose outcome is not delivered yet (busy slots).
        running: executions running.
        ready: claimed jobs waiting for a free slot.
        mean_run_seconds: running mean of how long executions take, or None.
        last_start: when a ready job last started (``time.monotonic()``).
        ready_moved: when ready jobs last moved: one started, or some came
            to an empty queue (``time.monotonic()``).
        held_by_queue: ready plus running jobs of each queue that has a
            share (see ``Slots``' ``shares``); empty without shares.
        alone: ``run_alone`` jobs held (waiting or running alone): while
            there are any, nothing more is claimed.
    """

    active: int
    running: int
    ready: int
    mean_run_seconds: float | None
    last_start: float
    ready_moved: float
    held_by_queue: Mapping[str, int]
    alone: int = 0

    @property
    def load(self) -> int:
        """Running plus ready jobs."""
        return self.running + self.ready


class Slots:
    """Ready jobs, running executions and the runner threads.

    Args:
        concurrency: most executions running at once.
        refill_at: when running + ready jobs fall to this many, ask for more.
        on_need_jobs: wakes the producer (at most once per refill, and when idle).
        timeout_of: a job's timeout in seconds, or None.
        work: runs one execution to its end, on a runner thread.
        shares: queue -> most of its jobs this worker holds (ready plus
            running) at once; the producer claims within it, and a job of a
            queue at its share that ends wakes the producer (the refill rule
            alone would not: other queues may keep the load high).
    """

    def __init__(
        self,
        *,
        concurrency: int,
        refill_at: int,
        on_need_jobs: Callable[[], None],
        timeout_of: Callable[[Job], float | None],
        work: Callable[[Execution], None],
        shares: Mapping[str, int] | None = None,
    ) -> None:
        self.concurrency = concurrency
        self._shares = dict(shares or {})
        # Queue -> ready plus running jobs, for the queues with a share only
        # (a worker without shares keeps no counts).
        self._held: dict[str, int] = dict.fromkeys(self._shares, 0)
        self._refill_at = refill_at
        self._on_need_jobs = on_need_jobs
        self._timeout_of = timeout_of
        self._work = work
        self._mean_run_seconds: float | None = None
        self._last_start = time.monotonic()
        self._ready_moved = self._last_start
        self._ready: collections.deque[Job] = collections.deque()
        # run_alone jobs waiting for the worker to have nothing else running,
        # and the (job id, fence) of the one started alone, until its outcome
        # is written (then nothing else starts).
        self._alone: collections.deque[Job] = collections.deque()
        self._lone: tuple[int, int] | None = None
        # (job id, fence) of outcomes delivered but not yet written (or
        # refused) by the completer.
        self._unsettled: set[tuple[int, int]] = set()
        self._running: dict[int, Execution] = {}
        self._lock = threading.Lock()
        # Two conditions on one lock: runners wait for work, wait_idle() for
        # the last execution to end; a notify never wakes the wrong kind.
        self._changed = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._runners = 0
        self._waiting = 0  # runners waiting for work
        self._runner_names = itertools.count(1)
        self._asked = False
        self._starting = True
        # Executions whose code returned and whose outcome is being delivered
        # (FINISHED's listeners, then the completer): not running any more,
        # but still held here; the worker must not flush and stop before they land.
        self._delivering: dict[int, tuple[Execution, float]] = {}  # and when it ended
        self._slow_named: set[int] = set()  # of those, named by slow_deliveries()
        # Set by abandon(): outcomes of code that returns later are not
        # delivered (the worker has stopped; its jobs await rescue).
        self._abandoned = False
        self._closed = False

    # -- reading --------------------------------------------------------------

    def snapshot(self) -> ExecutorState:
        """The state as of now, read under the lock."""
        with self._lock:
            return ExecutorState(
                active=len(self._running) + len(self._delivering),
                running=len(self._running),
                ready=len(self._ready) + len(self._alone),
                mean_run_seconds=self._mean_run_seconds,
                last_start=self._last_start,
                ready_moved=self._ready_moved,
                held_by_queue=dict(self._held) if self._held else NO_HELD,
                alone=len(self._alone) + (self._lone is not None),
            )

    def held_jobs(self) -> list[Job]:
        """Jobs held here: running and ready."""
        with self._lock:
            return [e.job for e in self._running.values()] + list(self._ready) + list(self._alone)

    def running(self, job_id: int) -> Execution | None:
        with self._lock:
            return self._running.get(job_id)

    def executions(self) -> list[Execution]:
        with self._lock:
            return list(self._running.values())

    def set_refill_at(self, count: int) -> None:
        """Ask for more jobs when running + ready fall to ``count``."""
        with self._lock:
            self._refill_at = count

    def wait_idle(self, timeout: float) -> bool:
        """Block until no execution is running (and every outcome is
        delivered) or ``timeout`` seconds pass.
        """
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running or self._delivering:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
            return True

    # -- ready jobs ------------------------------------------------------------

    def offer(self, jobs: Iterable[Job]) -> None:
        """Queue claimed jobs to run."""
        with self._lock:
            before = len(self._ready) + len(self._alone)
            if not before:
                self._ready_moved = time.monotonic()
            if self._held:
                jobs = list(jobs)
                for job in jobs:
                    if job.queue in self._held:
                        self._held[job.queue] += 1
            for job in jobs:
                (self._alone if job.run_alone else self._ready).append(job)
            self._asked = False
            self._spawn_runners()
            if len(self._ready) + len(self._alone) > before:
                # One runner, which passes it on (_pass_wake_on): all woken
                # here, the producer paid every wake-up as its jobs waited.
                self._changed.notify()

    def take_ready(self, *, stalled_for: float | None, stop_starting: bool) -> list[Job]:
        """Remove and return the ready jobs (to be handed back).

        Args:
            stalled_for: only when every slot is busy and no ready job has
                moved for this many seconds; None: in any case.
            stop_starting: also start nothing more from now on.
        """
        with self._lock:
            if stop_starting:
                self._starting = False
                self._changed.notify_all()
            elif stalled_for is not None and (
                not self._ready
                or len(self._running) < self.concurrency
                or time.monotonic() - self._ready_moved < stalled_for
            ):
                return []
            waiting = list(self._ready)
            self._ready.clear()
            if stop_starting:
                # A stalled worker keeps its suspects: it drains to them
                # (it claims nothing meanwhile), so they cannot starve.
                waiting.extend(self._alone)
                self._alone.clear()
            for job in waiting:
                self._release_share(job)
            return waiting

    def take_waiting(self, job_id: int, attempt: int) -> Job | None:
        """Remove and return the ready job of this attempt, if there is one."""
        with self._lock:
            waiting = None
            for ready in (self._ready, self._alone):
                waiting = next((j for j in ready if j.id == job_id), None)
                if waiting is not None:
                    break
            if waiting is None or waiting.attempt != attempt:
                return None
            ready.remove(waiting)
            wake = self._release_share(waiting)
        if wake:
            self._on_need_jobs()
        return waiting

    def _release_share(self, job: Job) -> bool:
        """One job of its queue less held (lock held). Returns whether the
        queue was at its share: the producer may have left it unclaimed.
        """
        held = self._held.get(job.queue)
        if held is None:
            return False
        self._held[job.queue] = held - 1
        return held >= self._shares[job.queue]

    # -- runners ---------------------------------------------------------------

    def _spawn_runners(self) -> None:
        """Enough runner threads for the work there is (lock held)."""
        wanted = min(self.concurrency, len(self._running) + len(self._ready) + len(self._alone))
        while self._runners < wanted:
            self._runners += 1
            name = f"jobkeeper-runner-{next(self._runner_names)}"
            threading.Thread(target=self._runner, name=name, daemon=True).start()

    def _need_jobs(self) -> bool:
        """Whether to wake the producer now (lock held)."""
        load = len(self._running) + len(self._ready) + len(self._alone)
        idle = load == 0
        low = load <= self._refill_at or (not self._ready and len(self._running) < self.concurrency)
        if idle or (low and not self._asked):
            self._asked = True
            return True
        return False

    def _next_execution(self) -> Execution | None:
        """Block until a ready job can start; None when this runner should exit."""
        with self._lock:
            while True:
                if self._closed or self._runners > self.concurrency:
                    self._runners -= 1
                    self._pass_wake_on()
                    return None
                execution = self._start_next() if self._starting else None
                if execution is not None:
                    wake = self._need_jobs()
                    self._pass_wake_on()
                    break
                self._waiting += 1
                woken = self._changed.wait(RUNNER_IDLE_EXIT)
                self._waiting -= 1
                if not woken and not self._ready and not self._alone:
                    self._runners -= 1
                    return None
        if wake:
            self._on_need_jobs()
        return execution

    def _pass_wake_on(self) -> None:
        """Wake one more waiting runner while ready jobs are left (lock held)."""
        if self._waiting and (self._ready or self._alone):
            self._changed.notify()

    def _start_next(self) -> Execution | None:
        """Move the next job that may start to running (lock held), or None.

        Ordinary jobs first; a ``run_alone`` job once nothing runs, and then
        nothing else until it ends.
        """
        if self._lone is not None:
            return None
        alone = False
        if self._ready and len(self._running) < self.concurrency:
            job = self._ready.popleft()
        elif self._alone and not self._running and not self._delivering and not self._unsettled:
            job = self._alone.popleft()
            alone = True
        else:
            return None
        self._last_start = self._ready_moved = time.monotonic()
        execution = Execution(job, self._timeout_of(job))
        if alone:
            execution.alone = True
            self._lone = (job.id, job.fence)
            execution.beside = list(self._alone)
            self._alone.clear()
            for other in execution.beside:  # handed back: no longer held here
                self._release_share(other)
        self._running[job.id] = execution
        return execution

    def _runner(self) -> None:
        while (execution := self._next_execution()) is not None:
            self._work(execution)

    # -- ending ------------------------------------------------------------------

    def ended(self, execution: Execution) -> tuple[bool, bool]:
        """Free ``execution``'s slot. Returns ``(deliver, wake)``: whether its
        outcome is to be delivered (then call :meth:`delivered` after), and
        whether to wake the producer once it is.
        """
        elapsed = time.monotonic() - execution.started
        with self._lock:
            if self._running.pop(execution.job.id, None) is not None and self._held:
                at_share = self._release_share(execution.job)
            else:
                at_share = False
            mean = self._mean_run_seconds
            self._mean_run_seconds = elapsed if mean is None else mean + (elapsed - mean) * 0.05
            deliver = not self._abandoned
            if deliver:
                self._delivering[execution.job.id] = (execution, time.monotonic())
                self._unsettled.add((execution.job.id, execution.job.fence))
            elif execution.alone:
                self._lone = None  # no outcome to wait for
            wake = self._need_jobs() or at_share
            if not self._running and not self._delivering:
                self._idle.notify_all()
            # No runner to wake: this one loops on to the next ready job.
        return deliver, wake

    def delivered(self, execution: Execution, wake: bool) -> None:
        """``execution``'s outcome, from :meth:`ended`, has been delivered."""
        # The lock (once a job, contended) only for the last or a slow one:
        # a dict operation is atomic, readers copy the dict before walking it.
        self._delivering.pop(execution.job.id, None)
        if self._slow_named or (not self._running and not self._delivering):
            with self._lock:
                self._slow_named.discard(execution.job.id)
                if not self._running and not self._delivering:
                    self._idle.notify_all()
        if wake:
            self._on_need_jobs()

    def settled(self, keys: Iterable[tuple[int, int]]) -> None:
        """The completer wrote (or the fence refused) the outcomes of these
        ``(job id, fence)``: a suspect may start once none of this worker's
        is left, and anything once a lone one's is in.
        """
        written = set(keys)
        with self._lock:
            before = len(self._unsettled)
            self._unsettled -= written
            if self._lone in written:
                # Jobs offered meanwhile may start now, on any waiting runner.
                self._lone = None
            elif before == len(self._unsettled) or self._unsettled or not self._alone:
                return
            self._changed.notify_all()

    def abandon(self) -> tuple[list[Job], list[Job]]:
        """Deliver no outcome of what still runs. Returns those jobs, and
        those whose code returned but whose outcome is still being reported
        (a FINISHED listener that blocks: a log handler on a full pipe, a
        span exporter that does not answer): neither is written, so both
        stay held for the rescue.
        """
        with self._lock:
            self._abandoned = True
            running = [execution.job for execution in self._running.values()]
            delivering = list(self._delivering.values())  # see delivered()
            return running, [execution.job for execution, _ in delivering]

    def slow_deliveries(self, older_than: float) -> list[tuple[Job, float]]:
        """Jobs whose code returned over ``older_than`` seconds ago and whose
        outcome is still being delivered, with those seconds; each is named
        once.
        """
        now = time.monotonic()
        with self._lock:
            slow = [
                (execution.job, now - ended)
                for execution, ended in list(self._delivering.values())  # see delivered()
                if now - ended > older_than and execution.job.id not in self._slow_named
            ]
            self._slow_named.update(job.id for job, _ in slow)
        return slow

    def close(self) -> None:
        """Let idle runner threads exit."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
