"""Asking running code to stop: cancel requests, timeouts (the deadline
watch) and the stop past the grace period; and the event loop async tasks
run on, since cancelling one is how it is asked to stop.

An interrupt only *asks*: ``TaskInterrupted`` is injected into a sync task's
thread (raised at its next Python bytecode; a ``time.sleep`` it is in ends
early, see :mod:`~jobkeeper.worker.sleeps`) and an async task is cancelled
(at its next await). What asked is recorded on the execution; the executor
decides the outcome once the code has returned.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from jobkeeper.errors import TaskInterrupted
from jobkeeper.models import Claim
from jobkeeper.worker import sleeps
from jobkeeper.worker.deadlines import DeadlineWatch
from jobkeeper.worker.slots import Execution, Slots, raise_in_thread

logger = logging.getLogger("jobkeeper.worker")

#: Seconds an attempt asked to stop at its timeout gets to return before the
#: worker warns that its code has not: an interrupted ``time.sleep`` or
#: Python loop returns at once (then the failure alone is logged); code
#: blocked in C does not.
NOT_RETURNED_AFTER = 1.0
#: Seconds between the warnings about an attempt still running past its
#: timeout (the first comes :data:`NOT_RETURNED_AFTER` after the deadline).
PAST_TIMEOUT_REMINDER = 300.0
#: Seconds the task loop's leftover tasks get to end, once cancelled, when
#: the worker stops (see :func:`wind_down`).
LOOP_WIND_DOWN = 5.0


async def wind_down(timeout: float) -> None:
    """What ``asyncio.run()`` does once its coroutine returns, for the task
    loop the worker closes: cancel the loop's other tasks, wait (up to
    ``timeout`` seconds) for them and for the tasks their cancellation
    starts, and finish the async generators left open.

    What the tasks opened on the loop ends with it: jobkeeper's async pool
    of the loop (an async task's ``enqueue_async`` opens one) is closed by
    its closer task once cancelled (``close_at_loop_end``). Closed with the
    loop, the pool's workers were destroyed pending, and every shutdown of
    such a worker printed "Exception ignored in AsyncConnectionPool.worker
    ... RuntimeError: Event loop is closed" three times.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    here = asyncio.current_task()
    for task in asyncio.all_tasks() - {here}:
        task.cancel()
    # Not cancelled again: a task the cancels started (a pool's shut-down)
    # would stop half-way.
    while pending := asyncio.all_tasks() - {here}:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await asyncio.wait(pending, timeout=remaining)
    await loop.shutdown_asyncgens()


class Interrupts:
    """Stops running executions on request, and hosts the event loop.

    Args:
        slots: the executor's running executions.
    """

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self._deadlines = DeadlineWatch(self._on_deadline, "jobkeeper-timeouts")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()

    def watch(self, job_id: int, deadline: float) -> None:
        """Interrupt ``job_id`` at ``deadline`` (``time.monotonic()``)."""
        self._deadlines.watch(job_id, deadline)

    def unwatch(self, job_id: int) -> None:
        self._deadlines.unwatch(job_id)

    def _interrupt(self, execution: Execution) -> None:
        """Ask running code to stop, once (its lock held). Before the code is
        called this does nothing: the start check sees the request instead.
        """
        if execution.interrupted or not execution.in_user_code:
            return
        execution.interrupted = True
        if execution.async_task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(execution.async_task.cancel)
        elif execution.thread_id is not None:
            raise_in_thread(execution.thread_id, TaskInterrupted)
            if execution.wake is not None:
                # After the injection: the woken sleep returns into it.
                sleeps.wake(execution.wake)

    def cancel(self, claim: Claim, reason: str) -> bool:
        """Ask the running attempt of ``claim`` to stop as cancelled. Returns
        True when this request was new.
        """
        execution = self._slots.running(claim.job_id)
        if execution is None or execution.job.attempt != claim.attempt:
            return False
        with execution.lock:
            if execution.finished or execution.cancel_reason is not None:
                return False  # the heartbeat reports a pending request at every beat
            execution.cancel_reason = reason
            self._interrupt(execution)
        return True

    def claim_lost(self, job_id: int, fence: int, reason: str) -> bool:
        """Ask the running attempt of ``job_id`` under claim ``fence`` to stop:
        the claim was rescued while this worker was silent, so the job may be
        running elsewhere. Its outcome is then a hand-back the fence refuses
        (nothing is written). Returns True when this request was new.
        """
        execution = self._slots.running(job_id)
        if execution is None or execution.job.fence != fence:
            return False
        with execution.lock:
            if execution.finished or execution.release_reason is not None:
                return False
            execution.release_reason = reason
            self._interrupt(execution)
        return True

    def interrupt_all(self, reason: str) -> int:
        """Ask every running execution to stop (shutdown after the grace
        period); each one whose code then returns is handed back with
        ``reason`` (or completes, if it succeeded). Returns how many were asked.
        """
        asked = 0
        for execution in self._slots.executions():
            with execution.lock:
                if execution.finished:
                    continue
                if execution.release_reason is None:
                    execution.release_reason = reason
                self._interrupt(execution)
                asked += 1
        return asked

    def _on_deadline(self, job_id: int) -> None:
        """The deadline watch, for ``job_id``'s attempt: at its timeout, asks
        the code to stop; :data:`NOT_RETURNED_AFTER` later, if the code has
        not returned, warns that the job stays held; then reminds every
        :data:`PAST_TIMEOUT_REMINDER` seconds. An attempt whose code returns
        is unwatched (the executor marks it finished first), so nothing is
        said of code that heeded the request: its failure says it all.
        """
        execution = self._slots.running(job_id)
        if execution is None or execution.deadline is None:
            return
        with execution.lock:
            if execution.finished:
                return
            if not execution.timed_out:
                execution.timed_out = True
                self._interrupt(execution)
                # Under the lock: the executor marks it finished before it
                # unwatches, so this watch cannot outlive the execution.
                self._deadlines.watch(job_id, time.monotonic() + NOT_RETURNED_AFTER)
                return
            first = execution.past_timeout_warnings == 0
            execution.past_timeout_warnings += 1
            self._deadlines.watch(job_id, time.monotonic() + PAST_TIMEOUT_REMINDER)
        job = execution.job
        late = time.monotonic() - execution.deadline
        if first:
            logger.warning(
                "job %s (%s) has not returned %.1fs after its timeout of %gs asked it to "
                "stop (code blocked in C or an async task blocking its loop sees the request "
                "only when that call returns): its slot stays busy and the job held until then",
                job.id,
                job.task,
                late,
                execution.timeout,
            )
        else:
            logger.warning(
                "job %s (%s) is still running %.0fs past its timeout of %gs; its slot stays "
                "busy until its code returns (stopping the worker frees it)",
                job.id,
                job.task,
                late,
                execution.timeout,
            )

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop async tasks run on, started on first use on its own thread."""
        with self._loop_lock:
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
        """Stop the deadline watch and the event loop (its tasks cancelled
        first, see :func:`wind_down`).
        """
        self._deadlines.close()
        loop = self._loop
        if loop is not None:
            if loop.is_running():
                ended = asyncio.run_coroutine_threadsafe(wind_down(LOOP_WIND_DOWN), loop)
                try:
                    ended.result(timeout=LOOP_WIND_DOWN + 1)
                except Exception as exc:  # noqa: BLE001 - a task blocking the loop, say: the stop goes on
                    ended.cancel()
                    logger.debug("the task loop did not wind down: %r", exc)
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=2)
            if not loop.is_running():
                loop.close()
