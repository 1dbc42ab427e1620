"""The job being executed, for code running inside a task."""

from __future__ import annotations

import contextvars

from jobkeeper.models import Job

_current_job: contextvars.ContextVar[Job | None] = contextvars.ContextVar(
    "jobkeeper_current_job", default=None
)


def current_job() -> Job:
    """The :class:`~jobkeeper.Job` whose task is running in this thread or
    asyncio task (as claimed: ``attempt`` is this attempt's number).

    Raises:
        LookupError: called outside a task run by a jobkeeper worker.
    """
    job = _current_job.get()
    if job is None:
        raise LookupError("current_job() is only available inside a task run by a worker")
    return job


def set_current_job(job: Job | None) -> contextvars.Token[Job | None]:
    """Internal: bind ``job`` for the running task (the executor calls this)."""
    return _current_job.set(job)


def reset_current_job(token: contextvars.Token[Job | None]) -> None:
    """Internal: undo :func:`set_current_job`."""
    _current_job.reset(token)
