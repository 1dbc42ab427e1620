"""Helpers of the in-process worker tests: raw SQL on either backend, running
a Worker on a thread, waiting on database conditions with a deadline.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg

from jobkeeper import Job, JobQueue, JobStatus

#: Longest any condition is waited for; far above what a passing run needs.
DEADLINE = 30.0


def is_pg(jq: JobQueue) -> bool:
    return jq.url.scheme == "postgresql"


def now_sql(jq: JobQueue) -> str:
    """The backend's "now" in its stored timestamp type."""
    return "now()" if is_pg(jq) else "((julianday('now') - 2440587.5) * 86400.0)"


def sql(jq: JobQueue, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh connection (autocommit); ``?`` placeholders
    on both backends. Returns the rows, if any.
    """
    if is_pg(jq):
        with psycopg.connect(jq.url.url, autocommit=True) as conn:
            cursor = conn.execute(query.replace("?", "%s"), tuple(params))
            return cursor.fetchall() if cursor.description else []
    conn = sqlite3.connect(jq.url.path, timeout=30, isolation_level=None)
    try:
        cursor = conn.execute(query, tuple(params))
        return cursor.fetchall()
    finally:
        conn.close()


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = DEADLINE, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def job(jq: JobQueue, job_id: int) -> Job:
    found = jq.get_job(job_id)
    assert found is not None, f"job {job_id} vanished"
    return found


def wait_status(
    jq: JobQueue, job_ids: Sequence[int], statuses: set[JobStatus], *, timeout: float = DEADLINE
) -> list[Job]:
    """Wait until every job is in one of ``statuses``; return them."""

    def check() -> list[Job] | None:
        jobs = [job(jq, i) for i in job_ids]
        return jobs if all(j.status in statuses for j in jobs) else None

    return wait_for(check, timeout=timeout, what=f"jobs {list(job_ids)} to reach {statuses}")


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


def install_heartbeat_log(jq: JobQueue) -> None:
    """Record every write of a worker's heartbeat_at in ``test_heartbeat_log``
    (a trigger), so heartbeat gaps are measured exactly, not by sampling.
    """
    if is_pg(jq):
        sql(
            jq,
            """
            CREATE TABLE test_heartbeat_log (worker_id text, at timestamptz);
            CREATE FUNCTION test_log_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO test_heartbeat_log VALUES (NEW.id, NEW.heartbeat_at);
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_log_heartbeat AFTER INSERT OR UPDATE ON jobkeeper_workers
                FOR EACH ROW EXECUTE FUNCTION test_log_heartbeat();
            """,
        )
        return
    sql(jq, "CREATE TABLE test_heartbeat_log (worker_id TEXT, at REAL)")
    for event in ("INSERT", "UPDATE"):
        sql(
            jq,
            f"CREATE TRIGGER test_log_heartbeat_{event.lower()} AFTER {event} "
            "ON jobkeeper_workers BEGIN "
            "INSERT INTO test_heartbeat_log VALUES (NEW.id, NEW.heartbeat_at); END",
        )


def heartbeat_log(jq: JobQueue, worker_id: str) -> list[float]:
    """Every heartbeat ``worker_id`` wrote, as sorted Unix seconds."""
    at = "extract(epoch FROM at)::float8" if is_pg(jq) else "at"
    rows = sql(jq, f"SELECT {at} FROM test_heartbeat_log WHERE worker_id = ?", [worker_id])
    return sorted(float(r[0]) for r in rows)
