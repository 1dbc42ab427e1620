"""The job being executed, for code running inside a task: which job it is
(:func:`current_job`) and how to complete it in the task's own transaction
(:func:`complete_in`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from jobkeeper.models import Job


class Binding:
    """What a running task sees of its job (internal): bound once per
    attempt in one context variable. The view ``current_job()`` returns is
    built on first use, so a task that never asks costs nothing more.

    Args:
        job: the claimed job.
        view: builds the task's view of ``job`` (the worker's adds the
            idempotency key); None: ``job`` itself.
    """

    __slots__ = ("_built", "_view", "job")

    def __init__(self, job: Job, view: Callable[[Job], Job] | None = None) -> None:
        self.job = job
        self._view = view
        self._built: Job | None = None

    def current_job(self) -> Job:
        built = self._built
        if built is None:
            built = self._built = self._view(self.job) if self._view is not None else self.job
        return built

    def complete_in(self, conn: Any, result: Any) -> None:
        """Overridden by the worker; here (a job context without a worker)
        there is nothing to complete.
        """
        raise LookupError("complete_in() is only available inside a task run by a worker")


_binding: contextvars.ContextVar[Binding | None] = contextvars.ContextVar(
    "jobkeeper_binding", default=None
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
    binding = _binding.get()
    if binding is None:
        raise LookupError("current_job() is only available inside a task run by a worker")
    return binding.current_job()


def bound_job() -> Job | None:
    """The job whose task runs in this thread or asyncio task, as claimed,
    or None: :func:`current_job` for code that asks on every call and must
    not raise (a log filter).
    """
    binding = _binding.get()
    return None if binding is None else binding.job


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
    binding = _binding.get()
    if binding is None:
        raise LookupError("complete_in() is only available inside a task run by a worker")
    binding.complete_in(conn, result)


def bind(binding: Binding | None) -> contextvars.Token[Binding | None]:
    """Internal: bind the running task's job (the executor calls this)."""
    return _binding.set(binding)


def unbind(token: contextvars.Token[Binding | None]) -> None:
    """Internal: undo :func:`bind`."""
    _binding.reset(token)


def set_current_job(job: Job) -> contextvars.Token[Binding | None]:
    """Internal: bind ``job`` as it is (``jobkeeper.testing``'s job context)."""
    return _binding.set(Binding(job))
