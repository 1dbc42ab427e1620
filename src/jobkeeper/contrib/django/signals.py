"""Django's ``task_started`` and ``task_finished`` signals for the attempts a
jobkeeper worker makes at Django tasks (internal).

Django's own backends send them around each run, on the thread that runs the
task, with the ``TaskResult`` as it is then (``django.tasks`` logs each one).
Here a listener of the backend's queue (``JobQueue.on_event``) sends them:
``task_started`` at the attempt's STARTED event, ``task_finished`` at its
FINISHED one, which the worker emits on that same thread once it knows how
the attempt ended, before writing it. The result's status is then what
``get_result`` reads once it is written: ``SUCCESSFUL``, ``FAILED`` (dead
or cancelled), or ``READY`` (to be retried, snoozed, or handed back).
"""

from __future__ import annotations

import datetime
import threading
import traceback
from typing import Any

from django.utils.module_loading import import_string

from jobkeeper.contrib.django.results import task_error
from jobkeeper.errors import JobkeeperError
from jobkeeper.events import EventKind, JobEvent, OutcomeKind

try:  # Django >= 6.0
    from django.tasks import task_backends
    from django.tasks.base import Task, TaskError, TaskResultStatus
    from django.tasks.signals import task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # the django-tasks backport
    from django_tasks import task_backends
    from django_tasks.base import Task, TaskError, TaskResultStatus
    from django_tasks.signals import task_finished, task_started
    from django_tasks.utils import normalize_json

#: How an attempt ended -> the status its task_finished result carries.
FINISHED_STATUSES = {
    OutcomeKind.COMPLETED: TaskResultStatus.SUCCESSFUL,
    OutcomeKind.DEAD: TaskResultStatus.FAILED,
    OutcomeKind.CANCELLED: TaskResultStatus.FAILED,
    OutcomeKind.RETRIED: TaskResultStatus.READY,
    OutcomeKind.SNOOZED: TaskResultStatus.READY,
    OutcomeKind.RELEASED: TaskResultStatus.READY,
}
#: Outcomes that add an entry to the job's errors.
_FAILED = frozenset({OutcomeKind.DEAD, OutcomeKind.CANCELLED, OutcomeKind.RETRIED})

#: What the Django task of this thread's attempt returned:
#: ``(job id, attempt, value)`` (set by the task's runner).
_returned = threading.local()


def note_return(job_id: int, attempt: int, value: Any) -> None:
    """Keep what an attempt's task returned, for its ``task_finished``."""
    _returned.value = (job_id, attempt, value)


class TaskSignals:
    """The listener of one backend's queue (see the module docstring).

    Args:
        alias: the ``TASKS`` key whose backend makes the results.
    """

    #: The events it listens to.
    KINDS = (EventKind.STARTED, EventKind.FINISHED)

    def __init__(self, alias: str) -> None:
        self._alias = alias
        # The attempt whose task_started this thread sent: FINISHED comes on
        # the same thread; a hand-back of a job never started comes elsewhere.
        self._started = threading.local()

    def __call__(self, event: JobEvent) -> None:
        job = event.job
        if job is None:
            return
        if event.kind is EventKind.STARTED:
            self._started.attempt = None
            task = _django_task(job.task)
            if task is None:
                return
            backend = task_backends[self._alias]
            result = backend.result_of(job, task)
            object.__setattr__(result, "status", TaskResultStatus.RUNNING)
            self._started.attempt = (job.id, job.attempt, task)
            task_started.send(sender=type(backend), task_result=result)
            return
        started = getattr(self._started, "attempt", None)
        if started is None or started[:2] != (job.id, job.attempt) or event.outcome is None:
            return
        self._started.attempt = None
        key = (job.id, job.attempt)
        backend = task_backends[self._alias]
        result = backend.result_of(job, started[2])
        status = FINISHED_STATUSES[event.outcome]
        object.__setattr__(result, "status", status)
        if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED):
            at = datetime.datetime.fromtimestamp(event.at, datetime.UTC)
            object.__setattr__(result, "finished_at", at)
        if event.outcome in _FAILED:
            result.errors.append(_attempt_error(event))
        returned = getattr(_returned, "value", None)
        _returned.value = None
        if event.outcome is OutcomeKind.COMPLETED and returned and returned[:2] == key:
            object.__setattr__(result, "_return_value", _json(returned[2]))
        if status is TaskResultStatus.FAILED:
            _send_failed(type(backend), result, _failure(event))
        else:
            task_finished.send(sender=type(backend), task_result=result)


def _send_failed(sender: type, result: Any, failure: BaseException) -> None:
    """Send a FAILED ``task_finished`` inside an ``except`` block holding
    ``failure``, as Django's ImmediateBackend sends it: Django's own receiver
    (``Signal is sent inside exception handlers, so exc_info() is
    available``) logs the failure with ``sys.exc_info()``'s traceback, and
    the django-tasks backport's with ``logger.exception``, which printed
    ``NoneType: None`` outside one. The exception's traceback and context
    are put back afterwards: raising it here only lends it to the receivers.
    """
    traceback, context = failure.__traceback__, failure.__context__
    try:
        raise failure
    except BaseException:  # noqa: BLE001 - the task's own, raised again only for exc_info()
        task_finished.send(sender=sender, task_result=result)
    finally:
        failure.__traceback__, failure.__context__ = traceback, context


def _failure(event: JobEvent) -> BaseException:
    """What the failed attempt's code raised, or, when it raised nothing (a
    timeout once its code returned, args that do not bind, a result that
    cannot be stored), jobkeeper's base error with the attempt's error text:
    the exception class its ``TaskError`` names (see :func:`task_error`).
    """
    if event.exception is not None:
        return event.exception
    return JobkeeperError(event.error or f"job {event.job_id}: {event.outcome}")


def _django_task(path: str) -> Any:
    """The Django task at dotted ``path``, or None (not one)."""
    try:
        task = import_string(path)
    except ImportError:
        return None
    return task if isinstance(task, Task) else None


def _attempt_error(event: JobEvent) -> Any:
    """The TaskError of the attempt that just failed, as Django's own
    backends make it from the exception (else from jobkeeper's error text).
    """
    exc = event.exception
    if exc is None:
        return task_error({"error": event.error or ""})
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )


def _json(value: Any) -> Any:
    """The return value as stored (JSON values), as Django's backends keep it."""
    try:
        return normalize_json(value)
    except (TypeError, ValueError):
        return value
