"""Runs claimed jobs: up to ``concurrency`` runner threads pull from a ready
queue; sync tasks run on the runner itself, async tasks on one event loop.
Enforces timeouts and turns every ending into exactly one outcome.

The producer (the worker's claim loop) fills the ready queue in batches and
is woken only when the queue runs low, so a runner finishing a job goes
straight on to the next one without any thread hand-off.

Only the code's own ending decides an execution's outcome. A timeout, a
cancel request or a stop past the grace period *asks* the code to stop
(``TaskInterrupted`` is injected into a sync task's thread, raised at its next
Python bytecode; an async task is cancelled, which lands at its next await)
and records why; the job stays held by this worker (heartbeats going, slot
busy) until the code returns, and only then is the outcome written: the
timeout failure, ``cancelled``, or the shutdown hand-back. Code stuck where
no interrupt reaches (C code, an async task blocking its loop) therefore
never runs beside its own retry (issue 13). Python cannot kill a thread, so
a slot held by code that never returns is freed only by stopping the worker
(see :meth:`Worker._shutdown`).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jobkeeper.config import Settings
from jobkeeper.context import reset_current_job, set_current_job
from jobkeeper.errors import Discard, PayloadError, Retry, Snooze, TaskInterrupted
from jobkeeper.models import Claim, Completion, Failure, Job
from jobkeeper.outcomes import (
    cancelled_attempt,
    claim_of,
    failed_attempt,
    released_attempt,
    snoozed_attempt,
)
from jobkeeper.payload import encode_result
from jobkeeper.tasks import Task
from jobkeeper.worker.deadlines import DeadlineWatch

logger = logging.getLogger("jobkeeper.worker")

Outcome = Completion | Failure

#: Seconds an idle runner thread waits for work before it exits.
RUNNER_IDLE_EXIT = 60.0
#: Seconds between the warnings about an attempt still running past its
#: timeout (the first comes at the deadline).
PAST_TIMEOUT_REMINDER = 300.0
#: A timed-out attempt that returns at least this many seconds past its
#: deadline says so in its error text.
LATE_NOTE_AFTER = 0.1


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
        self._deadlines = DeadlineWatch(self._on_deadline, "jobkeeper-timeouts")
        # Executions whose outcome is being handed to on_outcome: not running
        # any more, but the worker must not flush and stop before they land.
        self._delivering = 0
        # Set by abandon_running(): outcomes of code that returns later are
        # not written (the worker has stopped; its jobs await rescue).
        self._abandoned = False
        self._closed = False

    # -- bookkeeping ----------------------------------------------------------

    @property
    def active(self) -> int:
        """Executions whose outcome is not delivered yet (busy slots)."""
        with self._lock:
            return len(self._running) + self._delivering

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
                    execution = _Execution(job, task.timeout if task is not None else None)
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
            self._finish(execution, self._bad_job(job))
            return
        try:
            task.check_args(job.args)
        except PayloadError as exc:
            outcome = failed_attempt(job, self._settings, error=str(exc))
            self._finish(execution, outcome)
            return
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
        self._finish(execution, released_attempt(execution.job, reason))

    def _finish(self, execution: _Execution, outcome: Outcome) -> bool:
        """Deliver ``execution``'s outcome, once (its code has returned, or
        never started). Returns False if already delivered.
        """
        with execution.lock:
            if execution.finished:
                return False
            execution.finished = True
        self._deadlines.unwatch(execution.job.id)
        elapsed = time.monotonic() - execution.started
        with self._lock:
            self._running.pop(execution.job.id, None)
            mean = self.mean_run_seconds
            self.mean_run_seconds = elapsed if mean is None else mean + (elapsed - mean) * 0.05
            deliver = not self._abandoned
            if deliver:
                self._delivering += 1
            wake = self._need_jobs()
            if not self._running and not self._delivering:
                self._idle.notify_all()
            # No runner needs waking otherwise: one that could start a ready
            # job is never waiting (it is this one, looping on).
        if execution.done is not None:
            execution.done.set()
        if not deliver:
            logger.warning(
                "job %s (%s) returned after its worker gave up on it; nothing written: "
                "it is rescued rescue_after seconds after the worker's last heartbeat",
                execution.job.id,
                execution.job.task,
            )
            return True
        try:
            self._on_outcome(outcome)
        finally:
            with self._lock:
                self._delivering -= 1
                if not self._running and not self._delivering:
                    self._idle.notify_all()
        if wake:
            self._on_need_jobs()
        return True

    def _interrupt(self, execution: _Execution) -> None:
        """Ask running code to stop, once (its lock held). Before the code is
        called this does nothing: the start check sees the request instead.
        """
        if execution.interrupted or not execution.in_user_code:
            return
        execution.interrupted = True
        if execution.async_task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(execution.async_task.cancel)
        elif execution.thread_id is not None:
            _raise_in_thread(execution.thread_id, TaskInterrupted)

    def _start_user_code(
        self,
        execution: _Execution,
        *,
        thread_id: int | None = None,
        async_task: asyncio.Task[Any] | None = None,
    ) -> bool:
        """The last check before the task is called (see ``still_held``); it
        also starts the timeout. False: the execution was settled instead
        (cancelled, or handed back unstarted) and the task must not be called.
        """
        with execution.lock:
            if execution.finished:
                return False
            cancel_reason = execution.cancel_reason
            start = (
                cancel_reason is None
                and execution.release_reason is None
                and (self._still_held is None or self._still_held(execution.job))
            )
            if start:
                execution.thread_id = thread_id
                execution.async_task = async_task
                execution.in_user_code = True
                if execution.timeout:
                    execution.deadline = time.monotonic() + execution.timeout
        if not start:
            if cancel_reason is not None:
                self._finish(execution, cancelled_attempt(execution.job, cancel_reason))
            else:
                self._hand_back_unstarted(execution)
            return False
        if execution.deadline is not None:
            self._deadlines.watch(execution.job.id, execution.deadline)
        return True

    def _ended(
        self, execution: _Execution, *, result: Any = None, exc: BaseException | None = None
    ) -> Outcome:
        """The outcome of code that has returned ``result`` or raised ``exc``,
        given what asked it to stop meanwhile.
        """
        job = execution.job
        with execution.lock:
            timed_out = execution.timed_out
            cancel_reason = execution.cancel_reason
            release_reason = execution.release_reason
        if exc is None and not timed_out:
            return self._success(job, result)  # the work was done, even if asked to stop
        if cancel_reason is not None:
            return cancelled_attempt(job, cancel_reason)
        if timed_out:
            return self._timed_out(execution)
        if release_reason is not None:
            return released_attempt(job, release_reason)
        assert exc is not None
        return self._failure(job, exc)

    def _timed_out(self, execution: _Execution) -> Failure:
        job = execution.job
        assert execution.deadline is not None and execution.timeout is not None
        error = f"JobTimeout: task {job.task!r} exceeded its timeout of {execution.timeout:g}s"
        late = time.monotonic() - execution.deadline
        if late >= LATE_NOTE_AFTER:
            error += (
                f"; its code returned {late:.1f}s past its timeout (the job stayed held, "
                "its retry waiting, until then)"
            )
            logger.warning(
                "job %s (%s) returned %.1fs past its timeout of %gs; its timeout is recorded now",
                job.id,
                job.task,
                late,
                execution.timeout,
            )
        return failed_attempt(job, self._settings, error=error)

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
                if not self._start_user_code(execution, thread_id=threading.get_ident()):
                    return
                if self._on_start is not None:
                    self._on_start(job)
                result = task.fn(**job.args)
            finally:
                with execution.lock:
                    execution.in_user_code = False
                    if execution.interrupted and execution.thread_id is not None:
                        # The injected TaskInterrupted may still be pending (the
                        # code returned before it fired): clear it so it
                        # cannot fire in this runner's next job.
                        _raise_in_thread(execution.thread_id, None)
            outcome = self._ended(execution, result=result)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a task must not kill the worker
            outcome = self._ended(execution, exc=exc)
        finally:
            reset_current_job(token)
        self._finish(execution, outcome)

    async def _run_async(self, execution: _Execution, task: Task[Any, Any]) -> None:
        try:
            await self._run_async_settled(execution, task)
        except BaseException as exc:  # settle whatever happened
            logger.exception("unexpected error running job %s", execution.job.id)
            self._settle_after_internal_error(execution, exc)

    async def _run_async_settled(self, execution: _Execution, task: Task[Any, Any]) -> None:
        job = execution.job
        assert job.args is not None
        if not self._start_user_code(execution, async_task=asyncio.current_task()):
            return
        if self._on_start is not None:
            self._on_start(job)
        set_current_job(job)  # this asyncio task has its own context
        try:
            try:
                # A timeout or cancel cancels this asyncio task (_interrupt);
                # the outcome is decided here, once the code has returned.
                result = await task.fn(**job.args)
            finally:
                with execution.lock:
                    execution.in_user_code = False
            outcome = self._ended(execution, result=result)
        except BaseException as exc:  # noqa: BLE001
            outcome = self._ended(execution, exc=exc)
        self._finish(execution, outcome)

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
        if isinstance(exc, Snooze):
            return snoozed_attempt(job, exc.delay)
        task = self._tasks.get(job.task)
        backoff = task.backoff if task is not None else None
        if isinstance(exc, Retry):
            return failed_attempt(
                job,
                self._settings,
                error=f"Retry: {_safe_str(exc.reason)}",
                traceback=None,
                retry_in=exc.delay,
                backoff=backoff,
                exc=exc,
            )
        return failed_attempt(
            job,
            self._settings,
            error=_exception_text(exc),
            traceback=formatted,
            backoff=backoff,
            exc=exc,
        )

    def _settle_after_internal_error(self, execution: _Execution, exc: BaseException) -> None:
        """Last resort: an attempt whose outcome could not be built (a bug
        here, or user code misbehaving where it was not expected) still ends,
        as a failed attempt under the retry policy, so the job and its slot
        are never held for good. A no-op if it was settled after all.
        """
        error = f"internal error settling the attempt: {_exception_text(exc)}"
        self._finish(execution, failed_attempt(execution.job, self._settings, error=error))

    # -- stopping executions from outside -------------------------------------------

    def cancel(self, claim: Claim, reason: str) -> bool:
        """Cancel the job of ``claim``: at once if it has not started; else
        ask its code to stop, and it ends ``cancelled`` once the code has
        returned (``completed`` if the code succeeds anyway). Returns True
        when this request was new.
        """
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
        with execution.lock:
            if execution.finished or execution.cancel_reason is not None:
                return False  # the heartbeat reports a pending request at every beat
            execution.cancel_reason = reason
            self._interrupt(execution)
        return True

    def interrupt_all(self, reason: str) -> int:
        """Ask every running execution to stop (shutdown after the grace
        period); each one whose code then returns is handed back with
        ``reason`` (or completes, if it succeeded). Returns how many were asked.
        """
        with self._lock:
            executions = list(self._running.values())
        asked = 0
        for execution in executions:
            with execution.lock:
                if execution.finished:
                    continue
                if execution.release_reason is None:
                    execution.release_reason = reason
                self._interrupt(execution)
                asked += 1
        return asked

    def abandon_running(self) -> list[Job]:
        """Give up on the executions still running (shutdown, once they did
        not return when interrupted): their outcomes will not be delivered
        if their code returns later. Returns their jobs, which stay held.
        """
        with self._lock:
            self._abandoned = True
            return [execution.job for execution in self._running.values()]

    def _on_deadline(self, job_id: int) -> None:
        """The deadline watch: ``job_id``'s attempt passed its timeout (or,
        when it already had, a reminder is due). Asks the code to stop; the
        job stays held until the code returns.
        """
        with self._lock:
            execution = self._running.get(job_id)
        if execution is None or execution.deadline is None:
            return
        with execution.lock:
            if execution.finished:
                return
            first = not execution.timed_out
            execution.timed_out = True
            self._interrupt(execution)
            # Under the lock: _finish marks it finished before it unwatches,
            # so this reminder cannot outlive the execution.
            self._deadlines.watch(job_id, time.monotonic() + PAST_TIMEOUT_REMINDER)
        job = execution.job
        if first:
            logger.warning(
                "job %s (%s) passed its timeout of %gs and has not returned; it was asked to "
                "stop, and its slot stays busy and the job held until its code returns",
                job.id,
                job.task,
                execution.timeout,
            )
        else:
            logger.warning(
                "job %s (%s) is still running %.0fs past its timeout of %gs; its slot stays "
                "busy until its code returns (stopping the worker frees it)",
                job.id,
                job.task,
                time.monotonic() - execution.deadline,
                execution.timeout,
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
        """Stop the helper threads (executions must already be finished or
        abandoned: an abandoned one keeps its runner thread until it returns).
        """
        self._deadlines.close()
        with self._lock:
            self._closed = True
            self._changed.notify_all()  # idle runners see _closed and exit
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=2)
            if not loop.is_running():
                loop.close()
