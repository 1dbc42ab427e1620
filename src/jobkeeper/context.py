"""The job being executed, for code running inside a task: which job it is
(:func:`current_job`) and how to complete it in the task's own transaction
(:func:`complete_in`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from jobkeeper.models import Job

#: What the worker binds for a running task: completes it on a connection.
CompleteIn = Callable[[Any, Any], None]

_current_job: contextvars.ContextVar[Job | None] = contextvars.ContextVar(
    "jobkeeper_current_job", default=None
)
_complete_in: contextvars.ContextVar[CompleteIn | None] = contextvars.ContextVar(
    "jobkeeper_complete_in", default=None
)


def current_job() -> Job:
    """The :class:`~jobkeeper.Job` whose task is running in this thread or
    asyncio task (as claimed: ``attempt`` is this attempt's number).

    Run by a worker, it is a :class:`~jobkeeper.models.RunningJob`: its
    ``idempotency_key`` (str) is the same for every attempt of the job and
    unique across jobs and databases, and its ``fence`` (int) grows with
    every claim of the job, so a holder whose claim was lost holds a
    smaller one than the current holder.

    Raises:
        LookupError: called outside a task run by a jobkeeper worker.
    """
    job = _current_job.get()
    if job is None:
        raise LookupError("current_job() is only available inside a task run by a worker")
    return job


def complete_in(conn: Any, result: Any = None) -> None:
    """Complete the running job inside the caller's own transaction on
    ``conn``: the job is ``completed`` with ``result`` exactly when that
    transaction commits, together with whatever else it wrote. A task's
    writes to the queue's database and its completion are then one atomic
    step: exactly-once for those side effects.

    The write is fenced on this worker's claim ``(id, worker_id, attempt,
    fence)``: if the job was rescued from this worker (a heartbeat gap, a
    SIGSTOP, a partition), handed back or ended meanwhile, nothing is written
    and :class:`~jobkeeper.ClaimLost` is raised, and the caller's
    transaction must roll back. Once the update is made, the job's row is
    locked (PostgreSQL) or the database's write lock held (SQLite) until the
    caller commits or rolls back, so no rescue can come between it and the
    commit. Credit: River's ``JobCompleteTx`` (riverqueue/river), which
    fences on the job's state alone.

    After a commit, whatever the task does is not recorded: its return value
    is ignored and an exception it raises is logged, not counted as a
    failure. If the transaction rolls back instead (a later error in the
    caller's code), the job is still held and ends as the task does: its
    return value completes it, its exception fails the attempt under the
    retry policy. Commit or roll back before the task returns.

    May be called again in a new transaction after a rollback (a retried
    serialization failure); after a commit, a second call raises
    ``ClaimLost`` (the job is no longer held).

    Args:
        conn: the connection the caller's transaction is open on: a psycopg 3
            ``Connection`` (PostgreSQL) or a ``sqlite3.Connection`` (SQLite)
            to the queue's own database, or what ``connection=`` of
            ``enqueue`` accepts around one (Django's connection, a SQLAlchemy
            ``Connection`` or ``Session``). On an autocommit connection the
            completion commits at once, alone.
        result: the job's result, a JSON-native value (as a task's return).

    Raises:
        ClaimLost: this worker no longer holds the job; nothing was written.
        PayloadError: ``result`` is not storable; nothing was written.
        TypeError: ``conn`` is not a connection of the queue's kind, or is
            open on another database.
        DatabaseError: the database refused the write (a psycopg error may
            also have aborted the caller's transaction).
        LookupError: called outside a task run by a jobkeeper worker.
    """
    bound = _complete_in.get()
    if bound is None:
        raise LookupError("complete_in() is only available inside a task run by a worker")
    bound(conn, result)


def set_current_job(job: Job | None) -> contextvars.Token[Job | None]:
    """Internal: bind ``job`` for the running task (the executor calls this)."""
    return _current_job.set(job)


def reset_current_job(token: contextvars.Token[Job | None]) -> None:
    """Internal: undo :func:`set_current_job`."""
    _current_job.reset(token)


def set_complete_in(bound: CompleteIn | None) -> contextvars.Token[CompleteIn | None]:
    """Internal: bind what :func:`complete_in` calls for the running task."""
    return _complete_in.set(bound)


def reset_complete_in(token: contextvars.Token[CompleteIn | None]) -> None:
    """Internal: undo :func:`set_complete_in`."""
    _complete_in.reset(token)
