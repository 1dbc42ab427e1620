"""Runs claimed jobs, each on a slot (:mod:`~jobkeeper.worker.slots`): sync
tasks on their runner thread, async tasks on one event loop. Turns every
ending into exactly one outcome, reported once (FINISHED, then ``on_outcome``).

Only the code's own ending decides an execution's outcome. A timeout, a
cancel request or a stop past the grace period *asks* the code to stop
(``TaskInterrupted`` is injected into a sync task's thread, raised at its next
Python bytecode, and a ``time.sleep`` it is in ends early; an async task is
cancelled, which lands at its next await)
and records why; the job stays held by this worker (heartbeats going, slot
busy) until the code returns, and only then is the outcome written: the
timeout failure, ``cancelled``, or the shutdown hand-back. Code stuck where
no interrupt reaches (C code, an async task blocking its loop) therefore
never runs beside its own retry (issue 13). Python cannot kill a thread, so
a slot held by code that never returns is freed only by stopping the worker
(see :meth:`jobkeeper.worker.runner.Worker.run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jobkeeper.config import Settings
from jobkeeper.context import Binding, bind, unbind
from jobkeeper.errors import DatabaseError, PayloadError
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.models import Claim, Completion, Failure, Job
from jobkeeper.outcomes import (
    cancelled_attempt,
    claim_of,
    failed_attempt,
    outcome_error,
    outcome_kind,
    released_attempt,
)
from jobkeeper.tasks import Task
from jobkeeper.worker import sleeps
from jobkeeper.worker.interrupts import Interrupts
from jobkeeper.worker.sideeffects import AttemptBinding
from jobkeeper.worker.slots import Execution, ExecutorState, Slots, raise_in_thread
from jobkeeper.worker.verdicts import Outcome, Verdicts

logger = logging.getLogger("jobkeeper.worker")


#: Seconds a returned job's outcome may wait for the FINISHED listeners
#: before the worker warns of it (a listener should take microseconds).
SLOW_DELIVERY = 30.0
#: Why a claimed job is handed back before it started.
UNSTARTED = "worker stopping (or its claim was lost): handed back before it started"


class Executor:
    """Runs jobs and reports each one's outcome once.

    Args:
        tasks: the registry, name -> Task.
        settings: retry policy and payload limits.
        concurrency: most jobs running at once.
        refill_at: when running + ready jobs fall to this many, ask for more
            (see :meth:`set_refill_at`).
        on_outcome: called (from any thread) with each attempt's job and
            outcome, once.
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
        events: where each attempt's FINISHED event is emitted.
        shares: queue -> most of its jobs held here at once (see
            :class:`~jobkeeper.worker.slots.Slots`).
        running_job: the job as the task sees it (``current_job()``): the
            claimed job with what only the worker knows (its idempotency key).
        complete_in: writes ``complete_in(conn, result)`` of a task for its
            job (raising ``ClaimLost`` when the fence refuses it); None:
            ``complete_in`` raises LookupError in tasks.
        committed_in: whether a job's ``complete_in`` transaction committed
            (a database read), asked when its task failed after the call.
    """

    def __init__(
        self,
        *,
        tasks: Mapping[str, Task[Any, Any]],
        settings: Settings,
        concurrency: int,
        refill_at: int,
        on_outcome: Callable[[Job, Outcome], None],
        on_need_jobs: Callable[[], None],
        may_start: Callable[[Job], bool] | None = None,
        still_held: Callable[[Job], bool] | None = None,
        on_start: Callable[[Job], None] | None = None,
        events: EventBus | None = None,
        shares: Mapping[str, int] | None = None,
        running_job: Callable[[Job], Job] | None = None,
        complete_in: Callable[[Job, Any, Any], None] | None = None,
        committed_in: Callable[[Job], bool] | None = None,
    ) -> None:
        self._committed_in = committed_in
        self._running_job = running_job
        self._complete_in = complete_in
        self._on_start = on_start
        self._may_start = may_start
        self._still_held = still_held
        self._tasks = tasks
        self._settings = settings
        self._verdicts = Verdicts(settings, tasks)
        self._events = events if events is not None else EventBus()
        self.concurrency = concurrency
        self._on_outcome = on_outcome
        self._slots = Slots(
            concurrency=concurrency,
            refill_at=refill_at,
            on_need_jobs=on_need_jobs,
            timeout_of=self._timeout_of,
            work=self._work,
            shares=shares,
        )
        self._interrupts = Interrupts(self._slots)
        # Sync tasks' time.sleep ends when they are interrupted.
        sleeps.install()

    # -- what others may read and ask -------------------------------------------

    def snapshot(self) -> ExecutorState:
        """Busy slots, ready jobs, run times: one consistent reading."""
        return self._slots.snapshot()

    def running_jobs(self) -> list[Job]:
        """Jobs this executor holds: running and ready."""
        return self._slots.held_jobs()

    def settled(self, outcomes: Iterable[Outcome]) -> None:
        """``outcomes`` are written, or refused by their fence: the crash
        suspects' lone starts wait for that (see :mod:`.slots`).
        """
        self._slots.settled((o.claim.job_id, o.claim.fence) for o in outcomes)

    def set_refill_at(self, count: int) -> None:
        """Wake the producer when running + ready jobs fall to ``count``."""
        self._slots.set_refill_at(count)

    def wait_idle(self, timeout: float) -> bool:
        """Block until every outcome is delivered, for up to ``timeout`` seconds."""
        return self._slots.wait_idle(timeout)

    def hand_back(self, *, stalled_for: float | None = None, stop_starting: bool = False) -> int:
        """Hand back the ready jobs (claimed, never started): released, the
        attempt not spent, no errors entry (nothing happened to them). Returns
        how many.

        Args:
            stalled_for: seconds; only when every slot is busy and no ready
                job has started (nor come to an empty ready queue) for that
                long: the slots are held by jobs slower than the prefetch was
                sized for, and the jobs behind them should go elsewhere.
            stop_starting: also start nothing more (the worker is stopping).
        """
        waiting = self._slots.take_ready(stalled_for=stalled_for, stop_starting=stop_starting)
        for job in waiting:
            self._report(job, released_attempt(job, None))
        return len(waiting)

    def _report(
        self,
        job: Job,
        outcome: Outcome,
        duration: float | None = None,
        exc: BaseException | None = None,
    ) -> None:
        """Emit FINISHED and hand the outcome on: every attempt's ending, here only.

        For a started attempt this runs where its STARTED was emitted (the
        runner thread of a sync task, the asyncio task of an async one), so
        a listener may attach context at STARTED and detach it here.
        """
        try:
            if self._events.wants(EventKind.FINISHED) and self._events.wants_finished(
                kind := outcome_kind(outcome)
            ):
                self._events.emit(
                    JobEvent.of(
                        EventKind.FINISHED,
                        job,
                        outcome=kind,
                        duration=duration,
                        error=outcome_error(outcome),
                        exception=exc,
                    )
                )
        finally:
            # Whatever the listeners did, the outcome goes on: undelivered,
            # the job would stay running under this worker's live heartbeat.
            self._on_outcome(job, outcome)

    # -- feeding and running ------------------------------------------------------

    def offer(self, jobs: Iterable[Job]) -> None:
        """Queue claimed jobs (held by this worker) to run."""
        self._slots.offer(jobs)

    def _timeout_of(self, job: Job) -> float | None:
        task = self._tasks.get(job.task)
        return task.timeout if task is not None else None

    def _work(self, execution: Execution) -> None:
        """One execution, on its runner thread; the runner survives anything."""
        try:
            self._execute(execution)
        except BaseException as exc:
            with contextlib.suppress(Exception):  # a broken log handler included
                logger.exception("unexpected error running job %s", execution.job.id)
            self._settle_after_internal_error(execution, exc)

    def _execute(self, execution: Execution) -> None:
        job = execution.job
        for waiting in execution.beside:
            # Suspects that would have waited on this worker behind this
            # lone attempt: their lone attempts may run elsewhere now.
            self._report(waiting, released_attempt(waiting, None))
        if self._may_start is not None and not self._may_start(job):
            # The claim was lost while the worker was paused (SIGSTOP, a
            # database outage): the job may be running elsewhere, or be done.
            # The fenced hand-back then writes
            # nothing; if the worker is stopping instead, it hands the job back.
            self._finish(execution, released_attempt(job, UNSTARTED))
            return
        if execution.finished:
            return  # handed back or cancelled while may_start waited
        task = self._tasks.get(job.task)
        if task is None or job.args is None:
            self._finish(execution, self._verdicts.bad_job(job))
            return
        try:
            task.check_args(job.args)
        except PayloadError as exc:
            outcome = failed_attempt(job, self._settings, error=str(exc))
            self._finish(execution, outcome)
            return
        if task.is_async:
            execution.done = threading.Event()
            loop = self._interrupts.event_loop()
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

    def _finish(
        self, execution: Execution, outcome: Outcome, exc: BaseException | None = None
    ) -> bool:
        """Deliver ``execution``'s outcome, once (its code has returned, or
        never started). ``exc``: what the code raised, if it did. Returns
        False if already delivered.
        """
        with execution.lock:
            if execution.finished:
                return False
            execution.finished = True
            if execution.completed_in:
                outcome = dataclasses.replace(outcome, completed_in=True)
        self._interrupts.unwatch(execution.job.id)
        elapsed = time.monotonic() - execution.started
        deliver, wake = self._slots.ended(execution)
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
            self._report(execution.job, outcome, elapsed, exc)
        finally:
            self._slots.delivered(execution, wake)
        return True

    def _start_user_code(
        self,
        execution: Execution,
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
                if thread_id is not None:
                    execution.wake = sleeps.enter(thread_id)
                execution.async_task = async_task
                execution.in_user_code = True
                if execution.timeout:
                    execution.deadline = time.monotonic() + execution.timeout
        if not start:
            if cancel_reason is not None:
                self._finish(execution, cancelled_attempt(execution.job, cancel_reason))
            else:
                self._finish(execution, released_attempt(execution.job, UNSTARTED))
            return False
        if execution.deadline is not None:
            self._interrupts.watch(execution.job.id, execution.deadline)
        return True

    def _run_sync(self, execution: Execution, task: Task[Any, Any]) -> None:
        job = execution.job
        assert job.args is not None
        raised: BaseException | None = None
        token = bind(self._binding(execution))
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
                    if execution.wake is not None and execution.thread_id is not None:
                        sleeps.leave(execution.thread_id)
                        execution.wake = None
                    if execution.interrupted and execution.thread_id is not None:
                        # The injected TaskInterrupted may still be pending (the
                        # code returned before it fired): clear it so it
                        # cannot fire in this runner's next job.
                        raise_in_thread(execution.thread_id, None)
            outcome = self._verdicts.ended(execution, result=result)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a task must not kill the worker
            raised = exc
            outcome = self._verdicts.ended(execution, exc=exc)
        finally:
            unbind(token)
        self._finish(execution, self._after_complete_in(execution, outcome), raised)

    async def _run_async(self, execution: Execution, task: Task[Any, Any]) -> None:
        try:
            await self._run_async_settled(execution, task)
        except BaseException as exc:  # settle whatever happened
            logger.exception("unexpected error running job %s", execution.job.id)
            self._settle_after_internal_error(execution, exc)

    async def _run_async_settled(self, execution: Execution, task: Task[Any, Any]) -> None:
        job = execution.job
        assert job.args is not None
        if not self._start_user_code(execution, async_task=asyncio.current_task()):
            return
        if self._on_start is not None:
            self._on_start(job)
        # This asyncio task has its own context.
        bind(self._binding(execution))
        raised: BaseException | None = None
        try:
            try:
                # A timeout or cancel cancels this asyncio task (_interrupt);
                # the outcome is decided here, once the code has returned.
                result = await task.fn(**job.args)
            finally:
                with execution.lock:
                    execution.in_user_code = False
            outcome = self._verdicts.ended(execution, result=result)
        except BaseException as exc:  # noqa: BLE001
            raised = exc
            outcome = self._verdicts.ended(execution, exc=exc)
        if execution.completed_in:
            # A database read: not on the event loop.
            outcome = await asyncio.to_thread(self._after_complete_in, execution, outcome)
        self._finish(execution, outcome, raised)

    def _after_complete_in(self, execution: Execution, outcome: Outcome) -> Outcome:
        """The outcome of an attempt that failed after its complete_in: a
        completion if that transaction committed (the job is done; the
        failure is only logged), else the failure as it is.
        """
        if (
            not execution.completed_in
            or not isinstance(outcome, Failure)
            or self._committed_in is None
        ):
            return outcome
        job = execution.job
        try:
            committed = self._committed_in(job)
        except DatabaseError:
            return outcome  # the completer finds out when the write is refused
        if not committed:
            return outcome
        logger.info(
            "job %s (%s) attempt %s: completed by complete_in; what the task did after "
            "the commit is not recorded (%s)",
            job.id,
            job.task,
            job.attempt,
            outcome_error(outcome) or outcome.outcome,
        )
        return Completion(claim_of(job), None, completed_in=True)

    def _binding(self, execution: Execution) -> Binding:
        """What ``execution``'s task sees: ``current_job()`` and ``complete_in``."""
        return AttemptBinding(execution, self._running_job, self._complete_in)

    def _settle_after_internal_error(self, execution: Execution, exc: BaseException) -> None:
        """Last resort: an attempt whose outcome could not be built (a bug
        here, or user code misbehaving where it was not expected) still ends,
        as a failed attempt under the retry policy, so the job and its slot
        are never held for good. A no-op if it was settled after all.
        """
        self._finish(execution, self._verdicts.internal_error(execution.job, exc))

    # -- stopping executions from outside -------------------------------------------

    def cancel(self, claim: Claim, reason: str) -> bool:
        """Cancel the job of ``claim``: at once if it has not started; else
        ask its code to stop, and it ends ``cancelled`` once the code has
        returned (``completed`` if it returned before being asked). Returns True
        when this request was new.
        """
        waiting = self._slots.take_waiting(claim.job_id, claim.attempt)
        if waiting is not None:
            self._report(waiting, cancelled_attempt(waiting, reason))
            return True
        return self._interrupts.cancel(claim, reason)

    def claim_lost(self, job_id: int, fence: int, reason: str) -> bool:
        """Ask an attempt whose claim was rescued to stop; see
        :meth:`Interrupts.claim_lost`.
        """
        return self._interrupts.claim_lost(job_id, fence, reason)

    def interrupt_all(self, reason: str) -> int:
        """Ask every running execution to stop; see :meth:`Interrupts.interrupt_all`."""
        return self._interrupts.interrupt_all(reason)

    def name_slow_deliveries(self) -> None:
        """Warn of each outcome a FINISHED listener has held past
        ``SLOW_DELIVERY`` seconds: its job stays running, unwritten, under
        this worker's live heartbeat, which no rescue overrides.
        """
        for job, waited in self._slots.slow_deliveries(SLOW_DELIVERY):
            logger.warning(
                "job %s (%s) returned %.0fs ago, but its outcome still waits for the "
                "worker's event listeners (a log handler or span exporter that blocks): "
                "it stays running, unwritten, until they return",
                job.id,
                job.task,
                waited,
            )

    def abandon_running(self) -> tuple[list[Job], list[Job]]:
        """Deliver no outcome of what still runs (it did not return when
        interrupted at shutdown); returns those jobs, and those whose outcome
        is still being reported (see :meth:`Slots.abandon`): all stay held.
        """
        return self._slots.abandon()

    def close(self) -> None:
        """Stop the helper threads (executions must already be finished or
        abandoned: an abandoned one keeps its runner thread until it returns).
        """
        self._interrupts.close()
        self._slots.close()
