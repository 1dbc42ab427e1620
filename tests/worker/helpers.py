"""Helpers of the in-process worker tests: a Worker running on a thread, and
what those tests read of the jobs it ran. Raw SQL and waiting are in
``support``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from jobkeeper import Job, JobQueue, JobStatus
from jobkeeper.events import EventBus
from jobkeeper.models import WorkerInfo
from jobkeeper.worker.claims import Claims
from support.db import is_pg, sql
from support.waiting import DEADLINE, wait_status


def running_count(jq: JobQueue) -> int:
    """Jobs held by a worker: claimed (prefetched) or running."""
    query = "SELECT count(*) FROM jobkeeper_jobs WHERE status IN ('claimed', 'running')"
    return int(sql(jq, query)[0][0])


class Running:
    """A Worker running on a thread; ``stats`` once it returned."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.stats: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.stats = self.worker.run()
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, timeout: float = DEADLINE) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise self.error
        return self.stats


@contextlib.contextmanager
def running(worker: Any) -> Iterator[Running]:
    """Run ``worker`` on a thread for the block; stop and join it after."""
    handle = Running(worker)
    handle.thread.start()
    try:
        yield handle
    finally:
        worker.stop()
        if handle.thread.is_alive():
            handle.thread.join(DEADLINE)
        assert not handle.thread.is_alive(), "worker did not stop"
    if handle.error is not None:
        raise handle.error


def error_texts(j: Job) -> list[str]:
    return [str(e["error"]) for e in j.errors]


def holder_info(worker_id: str) -> WorkerInfo:
    """A worker row for ``worker_id`` on queue ``default``, beating now."""
    now = datetime.now(UTC)
    return WorkerInfo(worker_id, "test-host", 1, ["default"], now, now)


def age_heartbeat(jq: JobQueue, worker_id: str, seconds: float) -> None:
    """Make ``worker_id``'s last heartbeat ``seconds`` old."""
    if is_pg(jq):
        query = "UPDATE jobkeeper_workers SET heartbeat_at = now() - make_interval(secs => ?)"
    else:
        query = (
            "UPDATE jobkeeper_workers SET heartbeat_at = "
            "(julianday('now') - 2440587.5) * 86400.0 - ?"
        )
    sql(jq, query + " WHERE id = ?", [seconds, worker_id])


def claims_of(
    backend: Any, worker_id: str, heartbeat: Any, completer: Any = None, fresh_for: float = 1.0
) -> Claims:
    """A worker's claim book on ``backend``, with a stand-in ``heartbeat``
    (``liveness()``) and ``completer`` (``add_start``).
    """
    return Claims(
        backend=backend,
        worker_id=worker_id,
        heartbeat=heartbeat,
        completer=completer,
        fresh_for=fresh_for,
        stopping=threading.Event(),
        events=EventBus(),
    )


def gated_task(jq: JobQueue) -> tuple[Any, threading.Event]:
    """A task ``slow`` of ``jq`` that runs until the returned event is set."""
    gate = threading.Event()

    @jq.task
    def slow() -> None:
        gate.wait(30)

    return slow, gate


def lose_claim_mid_run(jq: JobQueue, worker: Any, job_id: int, gate: threading.Event) -> None:
    """With ``worker`` running job ``job_id`` of a :func:`gated_task`: pause
    its heartbeat until its own rescuer takes the job back (the holder looks
    silent), then let the task return, its outcome now refused by the fence.
    """
    wait_status(jq, [job_id], {JobStatus.RUNNING})
    worker.heartbeat.paused = True
    wait_status(jq, [job_id], {JobStatus.RETRYABLE, JobStatus.AVAILABLE})
    gate.set()


def claimed_job(job_id: int, **fields: Any) -> Job:
    """A job claimed by worker ``"w"`` (attempt 1 of 5, task ``"t"``), built
    without a database for the executor's own structures; ``fields`` override.
    """
    now = datetime.now(UTC)
    defaults: dict[str, Any] = {
        "task": "t",
        "args": {},
        "queue": "default",
        "status": JobStatus.CLAIMED,
        "priority": 0,
        "attempt": 1,
        "max_attempts": 5,
        "scheduled_at": now,
        "created_at": now,
        "worker_id": "w",
    }
    return Job(id=job_id, **{**defaults, **fields})
