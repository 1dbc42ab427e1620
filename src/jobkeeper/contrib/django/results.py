"""Django's ``TaskResult`` of a jobkeeper job (internal): the status mapping,
the attempts, the errors.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from typing import Any

from jobkeeper import Job, JobStatus

try:  # Django >= 6.0
    from django.tasks.base import TASK_REFRESH_ATTRS, TaskError, TaskResult, TaskResultStatus
except ImportError:  # the django-tasks backport
    from django_tasks.base import TASK_REFRESH_ATTRS, TaskError, TaskResult, TaskResultStatus

#: jobkeeper status -> Django's task result status.
STATUSES = {
    JobStatus.SCHEDULED: TaskResultStatus.READY,
    JobStatus.AVAILABLE: TaskResultStatus.READY,
    JobStatus.RETRYABLE: TaskResultStatus.READY,
    JobStatus.CLAIMED: TaskResultStatus.RUNNING,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}


class JobkeeperTaskResult(TaskResult):  # type: ignore[misc]
    """Django's ``TaskResult`` whose ``attempts`` is the job's count of
    attempts started. Django counts ``worker_ids``, which here holds only
    what jobkeeper records: the worker holding the job while it is claimed
    or running (none once it is done or waiting), not one id per attempt.
    """

    __slots__ = ("_attempts",)

    @property
    def attempts(self) -> int:
        """Attempts started (the running one included): the job's ``attempt``."""
        try:
            return int(self._attempts)
        except AttributeError:  # made by dataclasses.replace or unpickled
            return len(self.worker_ids)

    def refresh(self) -> None:
        """Reload the result from the job as stored now (Django's, with the
        attempts too).
        """
        self._take(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        """:meth:`refresh` for async code."""
        self._take(await self.task.get_backend().aget_result(self.id))

    def _take(self, fresh: Any) -> None:
        for name in (*TASK_REFRESH_ATTRS, "_attempts"):
            object.__setattr__(self, name, getattr(fresh, name))


def task_result(alias: str, job: Job, task: Any) -> JobkeeperTaskResult:
    """Django's result of ``job`` of Django task ``task`` on backend ``alias``.

    ``started_at`` and ``last_attempted_at`` are both the start of the
    current (or last) attempt: jobkeeper keeps no earlier start.
    """
    finished = job.status in (JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED)
    payload = job.args or {}
    result = JobkeeperTaskResult(
        task=task,
        id=str(job.id),
        status=STATUSES.get(job.status, TaskResultStatus.READY),
        enqueued_at=job.created_at,
        started_at=job.attempted_at,
        last_attempted_at=job.attempted_at,
        finished_at=job.finished_at if finished else None,
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=alias,
        errors=[task_error(error) for error in job.errors],
        worker_ids=[job.worker_id] if job.worker_id else [],
    )
    object.__setattr__(result, "_attempts", job.attempt)
    if job.status == JobStatus.COMPLETED:
        object.__setattr__(result, "_return_value", job.result)
    return result


#: A dotted path of Python identifiers (``module.Class``).
_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
#: The class path of a failure that raised no exception of the task's: a
#: worker lost mid-job, a refused payload.
_JOBKEEPER_ERROR = "jobkeeper.errors.JobkeeperError"


def task_error(error: Mapping[str, Any]) -> Any:
    """A Django ``TaskError`` from one of a job's ``errors``: the exception's
    dotted path comes from the traceback's last line (``module.Class: msg``),
    which Python writes without a module for built-in exceptions. An entry
    that names no class (``worker lost: ...``) gets jobkeeper's base error,
    so that Django's ``exception_class`` still imports.
    """
    traceback = str(error.get("traceback") or error.get("error") or "")
    lines = traceback.strip().splitlines()
    last = lines[-1] if lines else ""
    name = last.partition(":")[0].strip() or "Exception"
    if "." not in name and hasattr(builtins, name):
        name = f"builtins.{name}"
    elif "." not in name or not _CLASS_PATH.fullmatch(name):
        name = _JOBKEEPER_ERROR
    return TaskError(exception_class_path=name, traceback=traceback)
