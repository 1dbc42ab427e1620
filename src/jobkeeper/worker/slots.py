"""The executor's slots: claimed jobs waiting to start (ready), the
executions running, and the runner threads that move one to the other.

Up to ``concurrency`` runner threads pull from the ready queue; a runner that
finishes a job goes straight on to the next one, with no thread hand-off.
The producer fills the ready queue in batches and is woken (``on_need_jobs``)
only when it runs low. Everything here is guarded by one lock; what others
may read of it is one frozen :class:`ExecutorState`.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from jobkeeper.models import Job

#: Seconds an idle runner thread waits for work before it exits.
RUNNER_IDLE_EXIT = 60.0


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
        "async_task",
        "cancel_reason",
        "deadline",
        "done",
        "finished",
        "in_user_code",
        "interrupted",
        "job",
        "lock",
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
        self.cancel_reason: str | None = None
        self.release_reason: str | None = None
        self.thread_id: int | None = None
        self.async_task: asyncio.Task[Any] | None = None
        self.done: threading.Event | None = None
        #: While a sync task's code runs: what ends its ``time.sleep`` early
        #: (:mod:`~jobkeeper.worker.sleeps`).
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
    """

    active: int
    running: int
    ready: int
    mean_run_seconds: float | None
    last_start: float
    ready_moved: float

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
    """

    def __init__(
        self,
        *,
        concurrency: int,
        refill_at: int,
        on_need_jobs: Callable[[], None],
        timeout_of: Callable[[Job], float | None],
        work: Callable[[Execution], None],
    ) -> None:
        self.concurrency = concurrency
        self._refill_at = refill_at
        self._on_need_jobs = on_need_jobs
        self._timeout_of = timeout_of
        self._work = work
        self._mean_run_seconds: float | None = None
        self._last_start = time.monotonic()
        self._ready_moved = self._last_start
        self._ready: collections.deque[Job] = collections.deque()
        self._running: dict[int, Execution] = {}
        self._lock = threading.Lock()
        # Two conditions on one lock: runners wait for work, wait_idle() for
        # the last execution to end; a notify never wakes the wrong kind.
        self._changed = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._runners = 0
        self._runner_names = itertools.count(1)
        self._asked = False
        self._starting = True
        # Executions whose outcome is being delivered: not running any more,
        # but the worker must not flush and stop before they land.
        self._delivering = 0
        # Set by abandon(): outcomes of code that returns later are not
        # delivered (the worker has stopped; its jobs await rescue).
        self._abandoned = False
        self._closed = False

    # -- reading --------------------------------------------------------------

    def snapshot(self) -> ExecutorState:
        """The state as of now, read under the lock."""
        with self._lock:
            return ExecutorState(
                active=len(self._running) + self._delivering,
                running=len(self._running),
                ready=len(self._ready),
                mean_run_seconds=self._mean_run_seconds,
                last_start=self._last_start,
                ready_moved=self._ready_moved,
            )

    def held_jobs(self) -> list[Job]:
        """Jobs held here: running and ready."""
        with self._lock:
            return [e.job for e in self._running.values()] + list(self._ready)

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
            before = len(self._ready)
            if not before:
                self._ready_moved = time.monotonic()
            self._ready.extend(jobs)
            self._asked = False
            self._spawn_runners()
            self._changed.notify(len(self._ready) - before)

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
            return waiting

    def take_waiting(self, job_id: int, attempt: int) -> Job | None:
        """Remove and return the ready job of this attempt, if there is one."""
        with self._lock:
            waiting = next((j for j in self._ready if j.id == job_id), None)
            if waiting is None or waiting.attempt != attempt:
                return None
            self._ready.remove(waiting)
            return waiting

    # -- runners ---------------------------------------------------------------

    def _spawn_runners(self) -> None:
        """Enough runner threads for the work there is (lock held)."""
        wanted = min(self.concurrency, len(self._running) + len(self._ready))
        while self._runners < wanted:
            self._runners += 1
            name = f"jobkeeper-runner-{next(self._runner_names)}"
            threading.Thread(target=self._runner, name=name, daemon=True).start()

    def _need_jobs(self) -> bool:
        """Whether to wake the producer now (lock held)."""
        load = len(self._running) + len(self._ready)
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
                    return None
                if self._starting and self._ready and len(self._running) < self.concurrency:
                    job = self._ready.popleft()
                    self._last_start = self._ready_moved = time.monotonic()
                    execution = Execution(job, self._timeout_of(job))
                    self._running[job.id] = execution
                    wake = self._need_jobs()
                    break
                if not self._changed.wait(RUNNER_IDLE_EXIT) and not self._ready:
                    self._runners -= 1
                    return None
        if wake:
            self._on_need_jobs()
        return execution

    def _runner(self) -> None:
        while True:
            execution = self._next_execution()
            if execution is None:
                return
            self._work(execution)

    # -- ending ------------------------------------------------------------------

    def ended(self, execution: Execution) -> tuple[bool, bool]:
        """Free ``execution``'s slot. Returns ``(deliver, wake)``: whether its
        outcome is to be delivered (then call :meth:`delivered` after), and
        whether to wake the producer once it is.
        """
        elapsed = time.monotonic() - execution.started
        with self._lock:
            self._running.pop(execution.job.id, None)
            mean = self._mean_run_seconds
            self._mean_run_seconds = elapsed if mean is None else mean + (elapsed - mean) * 0.05
            deliver = not self._abandoned
            if deliver:
                self._delivering += 1
            wake = self._need_jobs()
            if not self._running and not self._delivering:
                self._idle.notify_all()
            # No runner needs waking otherwise: one that could start a ready
            # job is never waiting (it is this one, looping on).
        return deliver, wake

    def delivered(self, wake: bool) -> None:
        """An outcome from :meth:`ended` has been delivered."""
        with self._lock:
            self._delivering -= 1
            if not self._running and not self._delivering:
                self._idle.notify_all()
        if wake:
            self._on_need_jobs()

    def abandon(self) -> list[Job]:
        """Deliver no outcome of what still runs; return those jobs."""
        with self._lock:
            self._abandoned = True
            return [execution.job for execution in self._running.values()]

    def close(self) -> None:
        """Let idle runner threads exit."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
