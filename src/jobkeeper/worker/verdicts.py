"""The verdict on one attempt: the outcome to write, built from how its code
ended (returned, raised ``Retry``/``Snooze``/``Discard`` or anything else)
and from what asked it to stop meanwhile (a timeout, a cancel, a hand-back).
Pure decisions over the job, the settings and the task's retry policy; the
executor (:mod:`jobkeeper.worker.executor`) runs the code and reports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any, NoReturn

from jobkeeper.config import Settings
from jobkeeper.errors import Discard, PayloadError, Retry, Snooze
from jobkeeper.models import Completion, Failure, Job
from jobkeeper.outcomes import (
    cancelled_attempt,
    claim_of,
    completed_attempt,
    failed_attempt,
    released_attempt,
    snoozed_attempt,
    unstorable_result,
)
from jobkeeper.results_json import encode_result
from jobkeeper.tasks import Task
from jobkeeper.worker.slots import Execution

logger = logging.getLogger("jobkeeper.worker")

Outcome = Completion | Failure

#: A timed-out attempt that returns at least this many seconds past its
#: deadline says so in its error text.
LATE_NOTE_AFTER = 0.1


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


#: How many forks this process is a child of (counted in each child as the
#: fork returns): an attempt that ends in another process than the one that
#: runs the worker is a task's forked child coming back out of the task.
#: Compared once an attempt, in place of os.getpid(), a system call (0.2 us).
_forks = [0]


def _count_fork() -> None:
    _forks[0] += 1


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_count_fork)


class Verdicts:
    """Outcomes of attempts under ``settings`` and the tasks' retry policies.

    Args:
        settings: the worker's settings (payload limit, backoff).
        tasks: registered tasks by name (their ``backoff``).
    """

    def __init__(self, settings: Settings, tasks: Mapping[str, Task[Any, Any]]) -> None:
        self._settings = settings
        self._tasks = tasks
        #: The worker's process (see :func:`_end_forked_child`), as the
        #: count of forks this process came out of.
        self._forks = _forks[0]

    def ended(
        self, execution: Execution, *, result: Any = None, exc: BaseException | None = None
    ) -> Outcome:
        """The outcome of code that has returned ``result`` or raised ``exc``,
        given what asked it to stop meanwhile.
        """
        if _forks[0] != self._forks:
            _end_forked_child(exc)
        job = execution.job
        with execution.lock:
            timed_out = execution.timed_out
            cancel_reason = execution.cancel_reason
            release_reason = execution.release_reason
            cancelled = cancel_reason is not None and execution.interrupted
        if exc is None and not timed_out and not cancelled:
            # The work was done before anything asked it to stop. Code told
            # to stop that returns anyway (it caught the interrupt) ended by
            # the request, as a timed-out one does.
            return self.success(job, result)
        if cancel_reason is not None:
            return cancelled_attempt(job, cancel_reason)
        if timed_out:
            return self.timed_out(execution)
        if release_reason is not None:
            return released_attempt(job, release_reason)
        assert exc is not None
        return self.failure(job, exc)

    def timed_out(self, execution: Execution) -> Failure:
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

    def bad_job(self, job: Job) -> Failure:
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

    def success(self, job: Job, result: Any) -> Outcome:
        try:
            result_json = encode_result(result, max_bytes=self._settings.max_payload_bytes)
        except PayloadError as exc:
            return unstorable_result(claim_of(job), exc)
        return completed_attempt(job, result_json)

    def failure(self, job: Job, exc: BaseException) -> Failure:
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

    def internal_error(self, job: Job, exc: BaseException) -> Failure:
        """A failed attempt for an outcome that could not be built."""
        error = f"internal error settling the attempt: {_exception_text(exc)}"
        return failed_attempt(job, self._settings, error=error)


def _end_forked_child(exc: BaseException | None) -> NoReturn:
    """End a child that a task forked and that came back out of the task
    (it returned, raised, or called ``sys.exit()``), as ``sys.exit`` ends a
    script: the code of its ``SystemExit``, 1 for another exception, else 0.

    The child is a copy of the worker without the worker's other threads:
    going on, it ran the worker's code for good (it hung, and the task
    waiting for it with it). Nothing is cleaned up on the way out
    (``os._exit``): the worker's connections and files are the parent's.
    """
    code = 0
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    elif exc is not None:
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
