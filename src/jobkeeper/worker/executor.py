"""Runs claimed jobs: up to ``concurrency`` runner threads pull from a ready
queue; sync tasks run on the runner itself, async tasks on one event loop.
Enforces timeouts and turns every ending into exactly one outcome.

The producer (the worker's claim loop) fills the ready queue in batches and
is woken only when the queue runs low, so a runner finishing a job goes
straight on to the next one without any thread hand-off.

Every execution ends through :meth:`Executor._finish`, which is idempotent:
whichever comes first (the task returning, its timeout, a cancel request, or
the shutdown hand-back) decides the outcome, and later endings of the same
execution are dropped. A sync task cannot be killed, so when the outcome is
decided before it returns, ``JobCancelled`` is injected into its thread
(best effort: it is raised at the thread's next Python bytecode), the thread
is abandoned (its late result ignored) and a new runner takes its place.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import heapq
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jobkeeper.config import Settings
from jobkeeper.context import reset_current_job, set_current_job
from jobkeeper.errors import Discard, JobCancelled, PayloadError, Retry
from jobkeeper.models import Claim, Completion, Failure, Job
from jobkeeper.outcomes import cancelled_attempt, claim_of, failed_attempt, released_attempt
from jobkeeper.payload import encode_result
from jobkeeper.tasks import Task

logger = logging.getLogger("jobkeeper.worker")

Outcome = Completion | Failure

#: Seconds an idle runner thread waits for work before it exits.
RUNNER_IDLE_EXIT = 60.0


def _raise_in_thread(thread_id: int, exc_type: type[BaseException] | None) -> None:
    """Schedule ``exc_type`` in another thread (``None`` clears a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None
    )


def _safe_str(value: Any) -> str:
    """``str(value)``, or a note saying why not: a task's exception (or
    ``Discard`` reason) whose ``__str__`` raises must not stop its attempt
    from being settled.
    """
    try:
        return str(value)
    except BaseException as exc:  # noqa: BLE001 - any failure of user code
        return f"<str() raised {type(exc).__name__}>"


def _exception_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_safe_str(exc)}"


def _traceback_text(exc: BaseException) -> str | None:
    try:
        return "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - a broken exception object: keep the one-liner
        return None


class _Execution:
    """One attempt of one job in this worker."""

    __slots__ = (
        "abandoned",
        "async_task",
        "deadline",
        "done",
        "finished",
        "in_user_code",
        "job",
        "lock",
        "started",
        "thread_id",
    )

    def __init__(self, job: Job, deadline: float | None) -> None:
        self.job = job
        self.deadline = deadline
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.finished = False
        self.abandoned = False
        self.in_user_code = False
        self.thread_id: int | None = None
        self.async_task: asyncio.Task[Any] | None = None
        self.done: threading.Event | None = None


class Executor:
    """Runs jobs and reports each one's outcome once.

    Args:
        tasks: the registry, name -> Task.
        settings: retry policy and payload limits.
        concurrency: most jobs running at once.
        refill_at: when running + ready jobs fall to this many, ask for more.
        on_outcome: called (from any thread) with each execution's outcome.
        on_need_jobs: called when the ready queue runs low or the executor
            goes idle, to wake the producer (at most once per refill).
        may_start: called with each ready job before it starts (it may
            block); False hands the job back unstarted (fenced: nothing is
            written if the claim was lost meanwhile).
        still_held: called (it must not block) at the last moment before the
            task is called, after ``may_start`` said yes: False hands the job
            back unstarted. It narrows the window in which a process paused
            right after ``may_start`` (SIGSTOP, a VM freeze) would start a job
            whose claim was rescued meanwhile to the few instructions between
            this check and the call.
        on_start: called (it must not block) right after that last check,
            just before the task is called: the job's start mark (claimed ->
            running).
    """

    def __init__(
        self,
        *,
        tasks: Mapping[str, Task[Any, Any]],
        settings: Settings,
        concurrency: int,
        refill_at: int,
        on_outcome: Callable[[Outcome], None],
        on_need_jobs: Callable[[], None],
        may_start: Callable[[Job], bool] | None = None,
        still_held: Callable[[Job], bool] | None = None,
        on_start: Callable[[Job], None] | None = None,
    ) -> None:
        self._on_start = on_start
        self._may_start = may_start
        self._still_held = still_held
        self._tasks = tasks
        self._settings = settings
        self.concurrency = concurrency
        #: When running + ready jobs fall to this many, ask for more (the
        #: worker adjusts it as its prefetch adapts).
        self.refill_at = refill_at
        #: Running mean of how long executions take (seconds), or None.
        self.mean_run_seconds: float | None = None
        #: When a ready job last started (``time.monotonic()``).
        self.last_start = time.monotonic()
        # When ready jobs last moved: one started, or some came to an empty
        # queue (jobs offered after an idle spell have not waited at all).
        self._ready_moved = self.last_start
        self._on_outcome = on_outcome
        self._on_need_jobs = on_need_jobs
        self._ready: collections.deque[Job] = collections.deque()
        self._running: dict[int, _Execution] = {}
        self._lock = threading.Lock()
        # Two conditions on one lock: runners wait for work, wait_idle() for
        # the last execution to end; a notify never wakes the wrong kind.
        self._changed = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._runners = 0
        self._runner_names = itertools.count(1)
        self._asked = False
        self._starting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._deadlines: list[tuple[float, int, _Execution]] = []
        self._deadline_seq = itertools.count()
        self._deadline_changed = threading.Condition()
        self._watchdog: threading.Thread | None = None
        self._closed = False

    # -- bookkeeping ----------------------------------------------------------

    @property
    def active(self) -> int:
        """Executions whose outcome is not decided yet (busy slots)."""
        with self._lock:
            return len(self._running)

    @property
    def ready_count(self) -> int:
        """Claimed jobs waiting for a free slot."""
        with self._lock:
            return len(self._ready)

    def load(self) -> int:
        """Running plus ready jobs."""
        with self._lock:
            return len(self._running) + len(self._ready)

    def running_jobs(self) -> list[Job]:
        """Jobs this executor holds: running and ready."""
        with self._lock:
            return [e.job for e in self._running.values()] + list(self._ready)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no execution is running or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
            return True

    def stop_starting(self) -> int:
        """Start nothing more; hand back the jobs still waiting (see
        :meth:`_hand_back_waiting_jobs`). Returns how many.
        """
        with self._lock:
            self._starting = False
            waiting = list(self._ready)
            self._ready.clear()
            self._changed.notify_all()
        return self._hand_back_waiting_jobs(waiting)

    def hand_back_waiting(self, stalled_for: float) -> int:
        """Hand back (released, attempt not spent) every ready job when every
        slot is busy and none has started for ``stalled_for`` seconds (nor
        come to an empty ready queue, see ``_ready_moved``): the slots are held by
        jobs slower than the prefetch was sized for, and the jobs behind them
        should go to a worker with a free slot. Returns how many.
        """
        with self._lock:
            if (
                not self._ready
                or len(self._running) < self.concurrency
                or time.monotonic() - self._ready_moved < stalled_for
            ):
                return 0
            waiting = list(self._ready)
            self._ready.clear()
        return self._hand_back_waiting_jobs(waiting)

    def _hand_back_waiting_jobs(self, waiting: list[Job]) -> int:
        """Hand back claimed jobs that never started: released, attempt not
        spent, and no errors entry, as nothing happened to them.
        """
        for job in waiting:
            self._on_outcome(released_attempt(job, None))
        return len(waiting)

    # -- feeding and running ------------------------------------------------------

    def offer(self, jobs: Iterable[Job]) -> None:
        """Queue claimed jobs (status running, held by this worker) to run."""
        with self._lock:
            before = len(self._ready)
            if not before:
                self._ready_moved = time.monotonic()
            self._ready.extend(jobs)
            self._asked = False
            self._spawn_runners()
            self._changed.notify(len(self._ready) - before)

    def submit(self, job: Job) -> None:
        """Queue one claimed job (see :meth:`offer`)."""
        self.offer([job])

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
        low = load <= self.refill_at or (not self._ready and len(self._running) < self.concurrency)
        if idle or (low and not self._asked):
            self._asked = True
            return True
        return False

    def _next_execution(self) -> _Execution | None:
        """Block until a ready job can start; None when this runner should exit."""
        with self._lock:
            while True:
                if self._closed or self._runners > self.concurrency:
                    self._runners -= 1
                    return None
                if self._starting and self._ready and len(self._running) < self.concurrency:
                    job = self._ready.popleft()
                    self.last_start = self._ready_moved = time.monotonic()
                    task = self._tasks.get(job.task)
                    timeout = task.timeout if task is not None else None
                    execution = _Execution(job, time.monotonic() + timeout if timeout else None)
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
            try:
                self._execute(execution)
            except BaseException as exc:  # the runner must survive anything
                logger.exception("unexpected error running job %s", execution.job.id)
                self._settle_after_internal_error(execution, exc)
            if execution.abandoned:
                return  # a replacement runner took this thread's place

    def _execute(self, execution: _Execution) -> None:
        job = execution.job
        if self._may_start is not None and not self._may_start(job):
            # The claim was lost while the worker was paused (SIGSTOP, a
            # database outage): the job may be running elsewhere, or be done
            # (the soak caught such starts). The fenced hand-back then writes
            # nothing; if the worker is stopping instead, it hands the job back.
            self._hand_back_unstarted(execution)
            return
        if execution.finished:
            return  # handed back or cancelled while may_start waited
        task = self._tasks.get(job.task)
        if task is None or job.args is None:
            self._finish(execution, self._bad_job(job), interrupt=False)
            return
        try:
            task.check_args(job.args)
        except PayloadError as exc:
            outcome = failed_attempt(job, self._settings, error=str(exc))
            self._finish(execution, outcome, interrupt=False)
            return
        if execution.deadline is not None:
            self._watch(execution)
        if task.is_async:
            execution.done = threading.Event()
            loop = self._event_loop()
            done = execution.done
            future = asyncio.run_coroutine_threadsafe(self._run_async(execution, task), loop)
            # Also when the coroutine dies without settling (see below).
            future.add_done_callback(lambda _: done.set())
            # This runner is the job's slot until its outcome is decided.
            done.wait()
            if not execution.finished:
                # Only a failure of _run_async's own last resort gets here.
                error = future.exception() if not future.cancelled() else None
                raise error or RuntimeError("the async task ended without an outcome")
        else:
            self._run_sync(execution, task)

    def _hand_back_unstarted(self, execution: _Execution) -> None:
        reason = "worker stopping (or its claim was lost): handed back before it started"
        self._finish(execution, released_attempt(execution.job, reason), interrupt=False)

    def _finish(self, execution: _Execution, outcome: Outcome, *, interrupt: bool) -> bool:
        """Decide ``execution``'s outcome, once. Returns False if already decided."""
        with execution.lock:
            if execution.finished:
                return False
            execution.finished = True
            abandoned = self._interrupt(execution) if interrupt else False
        elapsed = time.monotonic() - execution.started
        with self._lock:
            self._running.pop(execution.job.id, None)
            mean = self.mean_run_seconds
            self.mean_run_seconds = elapsed if mean is None else mean + (elapsed - mean) * 0.05
            if abandoned:
                execution.abandoned = True
                self._runners -= 1
                self._spawn_runners()
            wake = self._need_jobs()
            if abandoned:
                self._changed.notify_all()
            if not self._running:
                self._idle.notify_all()
            # No runner needs waking otherwise: one that could start a ready
            # job is never waiting (it is this one, looping on).
        if execution.done is not None:
            execution.done.set()
        self._on_outcome(outcome)
        if wake:
            self._on_need_jobs()
        return True

    def _interrupt(self, execution: _Execution) -> bool:
        """Stop an execution whose outcome was decided from outside (its lock
        held). Returns True when a sync task's thread is left running.
        """
        if execution.async_task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(execution.async_task.cancel)
            return False
        if execution.in_user_code and execution.thread_id is not None:
            _raise_in_thread(execution.thread_id, JobCancelled)
            return True
        return False

    def _bad_job(self, job: Job) -> Failure:
        if job.args is None:
            # Straight to the dead letters: the stored args are the same at
            # every attempt, so retries would only delay this by the backoff.
            return failed_attempt(
                job,
                self._settings,
                error=f"cannot run job: {job.args_error}",
                discard_reason=f"{job.args_error} (written outside jobkeeper's enqueue, which "
                "refuses such args; fix them in the row, then requeue)",
            )
        known = ", ".join(sorted(self._tasks)) or "none"
        return failed_attempt(
            job,
            self._settings,
            error=f"unknown task {job.task!r}: no task of that name is registered in this "
            f"worker (known: {known})",
        )

    def _run_sync(self, execution: _Execution, task: Task[Any, Any]) -> None:
        job = execution.job
        assert job.args is not None
        token = set_current_job(job)
        try:
            try:
                with execution.lock:
                    if execution.finished:
                        return
                    held = self._still_held is None or self._still_held(job)
                    if held:
                        execution.thread_id = threading.get_ident()
                        execution.in_user_code = True
                if not held:
                    self._hand_back_unstarted(execution)
                    return
                if self._on_start is not None:
                    self._on_start(job)
                result = task.fn(**job.args)
            finally:
                with execution.lock:
                    execution.in_user_code = False
                    if execution.finished and execution.thread_id is not None:
                        # An injected JobCancelled may still be pending: clear
                        # it so it cannot fire in this pool thread's next job.
                        _raise_in_thread(execution.thread_id, None)
            outcome = self._success(job, result)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a task must not kill the worker
            if isinstance(exc, JobCancelled) and execution.finished:
                return  # whoever interrupted us decided the outcome
            outcome = self._failure(job, exc)
        finally:
            reset_current_job(token)
        self._finish(execution, outcome, interrupt=False)

    async def _run_async(self, execution: _Execution, task: Task[Any, Any]) -> None:
        try:
            await self._run_async_settled(execution, task)
        except BaseException as exc:  # settle whatever happened
            logger.exception("unexpected error running job %s", execution.job.id)
            self._settle_after_internal_error(execution, exc)

    async def _run_async_settled(self, execution: _Execution, task: Task[Any, Any]) -> None:
        job = execution.job
        assert job.args is not None
        current = asyncio.current_task()
        with execution.lock:
            if execution.finished:
                return
            held = self._still_held is None or self._still_held(job)
            execution.async_task = current
        if not held:
            self._hand_back_unstarted(execution)
            return
        if self._on_start is not None:
            self._on_start(job)
        set_current_job(job)  # this asyncio task has its own context
        try:
            # The timeout is the watchdog's, as for sync tasks: it decides the
            # outcome at the deadline and cancels this asyncio task.
            result = await task.fn(**job.args)
            outcome = self._success(job, result)
        except asyncio.CancelledError as exc:
            if execution.finished:
                return  # cancelled by _interrupt: the outcome is already decided
            outcome = self._failure(job, exc)
        except BaseException as exc:  # noqa: BLE001
            outcome = self._failure(job, exc)
        self._finish(execution, outcome, interrupt=False)

    def _success(self, job: Job, result: Any) -> Outcome:
        try:
            result_json = encode_result(result, max_bytes=self._settings.max_payload_bytes)
        except PayloadError as exc:
            # Straight to the dead letters: the same code returns the same
            # kind of value, so retries would only repeat the task's side
            # effects (up to max_attempts times) to the same end.
            error = f"result not storable: {exc}"
            return failed_attempt(
                job,
                self._settings,
                error=error,
                discard_reason=f"{error} (the task ran to its end: fix what it returns, "
                "then requeue)",
            )
        return Completion(claim_of(job), result_json)

    def _failure(self, job: Job, exc: BaseException) -> Failure:
        formatted = _traceback_text(exc)
        if isinstance(exc, Discard):
            reason = _safe_str(exc.reason)
            return failed_attempt(
                job,
                self._settings,
                error=f"Discard: {reason}",
                traceback=formatted,
                discard_reason=reason,
            )
        if isinstance(exc, Retry):
            return failed_attempt(
                job,
                self._settings,
                error=f"Retry: {_safe_str(exc.reason)}",
                traceback=None,
                retry_in=exc.delay,
            )
        return failed_attempt(job, self._settings, error=_exception_text(exc), traceback=formatted)

    def _settle_after_internal_error(self, execution: _Execution, exc: BaseException) -> None:
        """Last resort: an attempt whose outcome could not be built (a bug
        here, or user code misbehaving where it was not expected) still ends,
        as a failed attempt under the retry policy, so the job and its slot
        are never held for good. A no-op if it was settled after all.
        """
        error = f"internal error settling the attempt: {_exception_text(exc)}"
        self._finish(
            execution, failed_attempt(execution.job, self._settings, error=error), interrupt=False
        )

    # -- stopping executions from outside -------------------------------------------

    def cancel(self, claim: Claim, reason: str) -> bool:
        """Stop the execution holding ``claim``; its job ends ``cancelled``."""
        with self._lock:
            execution = self._running.get(claim.job_id)
            waiting = next((j for j in self._ready if j.id == claim.job_id), None)
            if waiting is not None and waiting.attempt == claim.attempt:
                self._ready.remove(waiting)
        if waiting is not None and waiting.attempt == claim.attempt:
            self._on_outcome(cancelled_attempt(waiting, reason))
            return True
        if execution is None or execution.job.attempt != claim.attempt:
            return False
        return self._finish(execution, cancelled_attempt(execution.job, reason), interrupt=True)

    def release_all(self, reason: str) -> int:
        """Hand every unfinished execution back (shutdown after the grace period)."""
        with self._lock:
            executions = list(self._running.values())
        released = 0
        for execution in executions:
            outcome = released_attempt(execution.job, reason)
            released += self._finish(execution, outcome, interrupt=True)
        return released

    def _watch(self, execution: _Execution) -> None:
        assert execution.deadline is not None
        with self._deadline_changed:
            heapq.heappush(
                self._deadlines, (execution.deadline, next(self._deadline_seq), execution)
            )
            self._deadline_changed.notify()
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch_deadlines, name="jobkeeper-timeouts", daemon=True
                )
                self._watchdog.start()

    def _watch_deadlines(self) -> None:
        while True:
            with self._deadline_changed:
                while not self._closed and (
                    not self._deadlines or self._deadlines[0][0] > time.monotonic()
                ):
                    wait = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
                    self._deadline_changed.wait(wait)
                if self._closed:
                    return
                _, _, execution = heapq.heappop(self._deadlines)
            if execution.finished:
                continue
            task = self._tasks.get(execution.job.task)
            timeout = task.timeout if task else None
            outcome = failed_attempt(
                execution.job,
                self._settings,
                error=f"JobTimeout: task {execution.job.task!r} exceeded its timeout of {timeout}s",
            )
            if self._finish(execution, outcome, interrupt=True):
                logger.warning(
                    "job %s (%s) timed out after %ss", execution.job.id, execution.job.task, timeout
                )

    # -- event loop -----------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._loop_thread = threading.Thread(
                    target=run, name="jobkeeper-asyncio", daemon=True
                )
                self._loop_thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Stop the helper threads (executions must already be finished or released)."""
        with self._deadline_changed:
            self._closed = True
            self._deadline_changed.notify_all()
        with self._lock:
            self._changed.notify_all()  # idle runners see _closed and exit
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=2)
            if not loop.is_running():
                loop.close()
