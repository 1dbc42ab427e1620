"""What a running task may rely on for its side effects (internal): its
job's idempotency key and :func:`jobkeeper.complete_in`, the completion
written on the task's own connection, in its own transaction, and the
attempt's binding through which a task reaches them (:class:`AttemptBinding`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from jobkeeper.backends.base import Backend
from jobkeeper.config import Settings
from jobkeeper.connections import unwrap_connection
from jobkeeper.context import Binding
from jobkeeper.errors import ClaimLost
from jobkeeper.models import Completion, Job, RunningJob
from jobkeeper.outcomes import claim_of
from jobkeeper.results_json import encode_result
from jobkeeper.worker.slots import Execution

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def idempotency_key(installation: str, job: Job) -> str:
    """``jk-<installation>-<id>-<created_at in µs since the epoch>``: fixed
    at enqueue, so the same for every attempt; the installation value
    (random per database) keeps two databases' job 1 apart, and the creation
    time keeps apart a job and the one given its id again by a database
    restored from a backup.
    """
    created_us = (job.created_at - _EPOCH) // timedelta(microseconds=1)
    return f"jk-{installation}-{job.id}-{created_us}"


class SideEffects:
    """Binds what a worker's tasks see of their job.

    Args:
        backend: a dedicated backend (one connection, never the API pool,
            which tasks may hold whole): tasks' threads take turns on it.
        settings: ``retention`` (0: complete_in deletes the job) and the
            payload limit of results.
    """

    def __init__(self, backend: Backend, settings: Settings) -> None:
        self._backend = backend
        self._settings = settings
        self._installation: str | None = None
        self._lock = threading.Lock()
        # Runner threads take turns on the backend's one connection.
        self._db_lock = threading.Lock()

    def installation(self) -> str:
        """The database's installation value, read once.

        Raises:
            DatabaseError: it cannot be read (not migrated, unreachable).
        """
        with self._lock:
            if self._installation is None:
                with self._db_lock:
                    self._installation = self._backend.installation_get()
            return self._installation

    def running_job(self, job: Job) -> RunningJob:
        """``job`` as ``current_job()`` returns it in its task."""
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
        return RunningJob(**fields, idempotency_key=idempotency_key(self.installation(), job))

    def committed_in(self, job: Job) -> bool:
        """Whether ``job`` is completed at its claim's fence: its task's
        ``complete_in`` transaction committed.
        """
        with self._db_lock:
            done = self._backend.job_completed_in(
                claims=[claim_of(job)], delete=self._settings.retention == 0
            )
        return job.id in done

    def complete_in(self, job: Job, connection: Any, result: Any) -> None:
        """Write ``job``'s completion with ``result`` on ``connection``, in its
        transaction, fenced on the job's claim.

        Raises:
            ClaimLost: the fence matched nothing: nothing written.
            PayloadError: ``result`` is not storable.
            TypeError: ``connection`` is not one to the queue's database.
        """
        result_json = encode_result(result, max_bytes=self._settings.max_payload_bytes)
        completion = Completion(claim_of(job), result_json)
        with self._db_lock:  # the same-database check reads on our connection
            written = self._backend.job_complete_in(
                connection=unwrap_connection(connection),
                completion=completion,
                delete=self._settings.retention == 0,
            )
        if not written:
            raise ClaimLost(job.id, job.attempt, job.fence)


class AttemptBinding(Binding):
    """One attempt's job context: its view is built only if the task asks
    (``current_job()``), and ``complete_in`` writes through the worker and
    marks the attempt so that its outcome is read back from the database.
    """

    __slots__ = ("_execution", "_write")

    def __init__(
        self,
        execution: Execution,
        view: Callable[[Job], Job] | None,
        write: Callable[[Job, Any, Any], None] | None,
    ) -> None:
        super().__init__(execution.job, view)
        self._execution = execution
        self._write = write

    def complete_in(self, conn: Any, result: Any) -> None:
        if self._write is None:
            super().complete_in(conn, result)
            return
        self._write(self.job, conn, result)
        with self._execution.lock:
            self._execution.completed_in = True
