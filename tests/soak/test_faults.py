"""Faults that could make a job run twice, as deterministic scenarios
(worker processes, real signals, a real outage):

- a PostgreSQL outage longer than ``rescue_after``: when the database came
  back, a rescuer could judge live workers by their pre-outage heartbeats and
  rescue (so re-run) jobs they were still running;
- SQLite's write lock held for longer than ``rescue_after`` (by a process
  stopped mid-transaction): every heartbeat waited alike, and when the lock
  was released a rescuer's write could get it first and take live workers'
  jobs;
- a SIGSTOPped worker: its claims are rescued and its jobs run elsewhere; on
  SIGCONT it started the jobs it had claimed but not yet begun, after they had
  completed on another worker.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks.soak.faults import Workers
from benchmarks.soak.history import read_exec_logs
from benchmarks.soak.pg import PrivatePostgres

from jobkeeper import JobQueue
from support.settings import SOAK, soak_env
from support.waiting import wait_for

pytestmark = [pytest.mark.soak, pytest.mark.slow]


#: A worker with one slot and a fixed prefetch of one (the CLI's worker
#: adapts its prefetch, and gives jobs that run long none).
PREFETCH_WORKER = """
import logging, sys
from benchmarks.soak.app import jq
from jobkeeper.worker.runner import Worker
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
q = jq.using(sys.argv[1])
worker = Worker(q.backend, q.tasks, q.settings, queues=["default"], concurrency=1, prefetch=1)
sys.exit(worker.run().exit_code)
"""


class PrefetchWorkers(Workers):
    def command(self, slot: int = 0) -> list[str]:
        return [sys.executable, "-c", PREFETCH_WORKER, self.url_of(slot)]


def workers_for(
    url: str, out: Path, count: int, concurrency: int, kind: type[Workers] = Workers
) -> Workers:
    (out / "exec").mkdir(exist_ok=True)
    env = soak_env(SOAK)
    env["SOAK_LOG_DIR"] = str(out / "exec")
    return kind(url, count, concurrency, ["default"], env, out)


def statuses(jq: JobQueue, ids: list[int]) -> list[str]:
    return [jq.get_job(i).status.value for i in ids]  # type: ignore[union-attr]


def logs(out: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(out.glob("worker-*.log")))


@contextlib.contextmanager
def running_on_private_postgres(
    tmp_path: Path, *, jobs: int, ms: int, count: int, concurrency: int
) -> Iterator[tuple[PrivatePostgres, JobQueue, list[int], Workers]]:
    """A private PostgreSQL server with ``jobs`` soak jobs of ``ms``
    milliseconds, all running on ``count`` worker processes; yields the
    server, a queue on it, the job ids and the workers, and cleans up.
    """
    pg = PrivatePostgres()
    workers = None
    try:
        pg.init()
        jq = JobQueue(pg.url, **SOAK)
        jq.migrate()
        batch = [("soak.work", {"n": i, "ms": ms}) for i in range(jobs)]
        ids = [j.id for j in jq.enqueue_many(batch)]
        workers = workers_for(pg.url, tmp_path, count=count, concurrency=concurrency)
        workers.start_all()
        wait_for(
            lambda: statuses(jq, ids) == ["running"] * jobs, timeout=30, what="every job to run"
        )
        yield pg, jq, ids, workers
    finally:
        if workers is not None:
            workers.stop_all(timeout=10)
        pg.cleanup()


def test_a_database_outage_longer_than_rescue_after_rescues_no_live_worker(tmp_path):
    with running_on_private_postgres(tmp_path, jobs=4, ms=5000, count=2, concurrency=2) as (
        pg,
        jq,
        ids,
        workers,
    ):
        jq.close()
        pg.stop("fast")
        time.sleep(2.5 * SOAK["rescue_after"])  # every heartbeat is now stale
        pg.start()
        wait_for(
            lambda: statuses(jq, ids) == ["completed"] * 4, timeout=30, what="all four to complete"
        )
        for job_id in ids:
            job = jq.get_job(job_id)
            assert job is not None
            assert (job.attempt, job.errors) == (1, []), job.errors
        events, _ = read_exec_logs(tmp_path / "exec")
        assert Counter(e.job for e in events if e.kind == "S") == Counter(ids)
        assert "rescued" not in logs(tmp_path)
        assert workers.stop_all(timeout=30) == {0: 0, 1: 0}
        jq.close()


def test_a_worker_stopped_during_an_outage_counts_what_it_left_held(tmp_path):
    # SIGTERM while the database is down: the jobs finish, but their outcomes
    # cannot be written, so they stay held (to be rescued). The stop line
    # said "0 left held" (it counted only code that would not return) right
    # after the ERROR line saying two outcomes were unwritten.
    with running_on_private_postgres(tmp_path, jobs=2, ms=1500, count=1, concurrency=2) as (
        pg,
        jq,
        _ids,
        workers,
    ):
        jq.close()
        pg.stop("fast")
        assert workers.stop_all(timeout=30) == {0: 1}
        log = logs(tmp_path)
        assert "2 outcomes still unwritten at shutdown" in log, log[-3000:]
        assert "0 completed, 0 failed, 0 snoozed, 0 cancelled, 0 handed back, 2 left held" in log, (
            log[-3000:]
        )


def test_sqlite_write_lock_held_past_rescue_after_rescues_no_live_worker(tmp_path):
    path = tmp_path / "jobs.db"
    jq = JobQueue(f"sqlite:///{path}", **SOAK)
    jq.migrate()
    ids = [j.id for j in jq.enqueue_many([("soak.work", {"n": i, "ms": 5000}) for i in range(4)])]
    workers = workers_for(f"sqlite:///{path}", tmp_path, count=2, concurrency=2)
    try:
        workers.start_all()
        wait_for(
            lambda: statuses(jq, ids) == ["running"] * 4, timeout=30, what="all four jobs to run"
        )
        # Another process holds the write lock, as a worker SIGSTOPped in the
        # middle of a write would: every heartbeat waits behind it.
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        time.sleep(3 * SOAK["rescue_after"])
        holder.execute("ROLLBACK")
        holder.close()
        wait_for(
            lambda: statuses(jq, ids) == ["completed"] * 4, timeout=30, what="all four to complete"
        )
        assert workers.stop_all(timeout=30) == {0: 0, 1: 0}
    finally:
        workers.stop_all(timeout=10)
    for job_id in ids:
        job = jq.get_job(job_id)
        assert job is not None
        assert (job.attempt, job.errors) == (1, []), job.errors
    jq.close()


def test_a_resumed_worker_does_not_start_jobs_whose_claims_it_lost(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    jq = JobQueue(url, **SOAK)
    jq.migrate()
    # One slot plus one prefetched job: worker A runs "first" and holds
    # "second" claimed but not started. Worker B is the same kind.
    first, second = jq.enqueue_many(
        [
            ("soak.work", {"n": 1, "ms": 2500}, {"priority": -1}),
            ("soak.work", {"n": 2, "ms": 10}, {"priority": 0}),
        ]
    )
    workers = workers_for(url, tmp_path, count=2, concurrency=1, kind=PrefetchWorkers)
    try:
        workers.start(0)
        wait_for(
            lambda: statuses(jq, [first.id, second.id]) == ["running", "claimed"],
            timeout=30,
            what="worker A to claim both jobs",
        )
        workers.pause(0)
        workers.start(1)  # worker B rescues both and runs them
        wait_for(
            lambda: statuses(jq, [first.id, second.id]) == ["completed", "completed"],
            timeout=30,
            what="worker B to rescue and complete both",
        )
        workers.resume(0)
        time.sleep(1.5)  # A's runner is free again: it must not start "second"
        codes = workers.stop_all(timeout=30)
    finally:
        workers.stop_all(timeout=10)
    assert codes == {0: 0, 1: 0}, logs(tmp_path)
    events, _ = read_exec_logs(tmp_path / "exec")
    starts = Counter(e.job for e in events if e.kind == "S")
    assert starts[second.id] == 1, (events, logs(tmp_path))
    done = jq.get_job(second.id)
    assert done is not None
    # B ran it at the attempt A never started: the free return gave it back.
    assert done.status.value == "completed" and done.attempt == 1 and done.fence == 2
    jq.close()
