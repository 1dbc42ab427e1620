"""SQLite: a worker's periodic writes take the database's one write lock only
when they have something to write.

Idle polls (claim on an empty queue, staging with nothing due, pruning with
nothing old) read first, outside any transaction; a WAL reader takes no lock.
Before this, every poll of every worker process took the write lock, and with
CPU-bound tasks slowing each Python step of the holder, heartbeats queued
behind those holds for hundreds of milliseconds (tests/soak/test_long_jobs.py
failed about one run in five on SQLite).
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta

import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.sqlite.backend import QUERIES
from jobkeeper.errors import DatabaseError, DatabaseUnavailable
from jobkeeper.models import WorkerInfo

WORKER = WorkerInfo(
    id="host:1:abcd",
    hostname="host",
    pid=1,
    queues=["default"],
    started_at=datetime.now(UTC),
    heartbeat_at=datetime.now(UTC),
)


@pytest.fixture
def locked_queue(sqlite_url: str):
    """A migrated SQLite queue (busy timeout 0.3 s) and a second connection
    that holds the write lock, the way another worker process mid-write does.
    """
    jq = JobQueue(sqlite_url, busy_timeout=0.3)
    jq.migrate()
    jq.backend.worker_register(worker=WORKER)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        yield jq, holder
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        jq.close()


def _lock(holder: sqlite3.Connection) -> None:
    holder.execute("BEGIN IMMEDIATE")


def _statements(backend) -> list[str]:
    """Record the statements ``backend``'s connection (this thread's) runs."""
    seen: list[str] = []
    backend._conn().set_trace_callback(seen.append)
    return seen


def test_idle_polls_do_not_wait_for_the_write_lock(locked_queue):
    jq, holder = locked_queue
    # A queue on the same file with a long busy timeout: a poll that waited
    # for the lock would take all of it, far beyond what a loaded machine
    # adds to four small reads.
    patient = JobQueue(jq.url.url, busy_timeout=5.0)
    backend = patient.backend.dedicated()
    try:
        seen = _statements(backend)
        _lock(holder)
        started = time.monotonic()
        assert backend.job_claim(worker_id=WORKER.id, queue="default", limit=10) == []
        assert backend.job_stage_due().staged == 0
        assert backend.job_prune_finished(older_than=3600, limit=100) == 0
        assert backend.worker_prune_stale(older_than=3600) == 0
        # All four returned without waiting for the lock, and none so much
        # as began a write transaction.
        assert time.monotonic() - started < 5.0
        assert len(seen) == 4
        assert all("LIMIT 1" in s and "BEGIN" not in s for s in seen), seen
    finally:
        backend.close()
        patient.close()


def test_prunes_with_work_delete_what_is_old(locked_queue):
    """Each probe matches its write: with old rows present, the prunes find
    and delete them (a probe drifting from its DELETE would skip them).
    """
    jq, holder = locked_queue
    done = jq.enqueue("t", {})
    backend = jq.backend.dedicated()
    try:
        [claimed] = backend.job_claim(worker_id=WORKER.id, queue="default", limit=1)
        assert claimed.id == done.id
        holder.execute(
            "UPDATE jobkeeper_jobs SET status = 'completed', worker_id = NULL, "
            "finished_at = unixepoch() - 7200 WHERE id = ?",
            (done.id,),
        )
        assert backend.job_prune_finished(older_than=3600, limit=100) == 1
        assert jq.get_job(done.id) is None
        holder.execute("UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - 7200")
        assert backend.worker_prune_stale(older_than=3600) == 1
        assert backend.worker_list() == []
    finally:
        backend.close()


def test_polls_with_work_still_write_under_the_lock(locked_queue):
    """The probe only skips empty polls: with work, the write waits for the
    lock (and fails cleanly if it never comes), then does its work.
    """
    jq, holder = locked_queue
    job = jq.enqueue("t", {})
    jq.enqueue("t", {}, delay=3600)
    backend = jq.backend.dedicated()
    try:
        _lock(holder)
        with pytest.raises(DatabaseError, match="locked") as caught:
            backend.job_claim(worker_id=WORKER.id, queue="default", limit=10)
        # A lock held past the busy timeout is no outage (see IntervalService).
        assert isinstance(caught.value, DatabaseUnavailable)
        assert caught.value.unreachable is False
        holder.execute("ROLLBACK")
        claimed = backend.job_claim(worker_id=WORKER.id, queue="default", limit=10)
        assert [j.id for j in claimed] == [job.id]
        # Make the delayed job due: staging then has work and does it.
        holder.execute(
            "UPDATE jobkeeper_jobs SET scheduled_at = scheduled_at - 7200 "
            "WHERE status = 'scheduled'"
        )
        assert backend.job_stage_due().staged == 1
    finally:
        backend.close()


def test_heartbeat_is_one_statement_and_re_registers_a_pruned_worker(locked_queue):
    jq, holder = locked_queue
    backend = jq.backend.dedicated()
    try:
        before = {w.id: w.heartbeat_at for w in backend.worker_list()}[WORKER.id]
        time.sleep(0.01)
        seen = _statements(backend)
        backend.worker_heartbeat(worker=WORKER)
        # The lock is taken and released inside one statement: no BEGIN/COMMIT
        # (the busy handler's slice is set around it: a PRAGMA takes no lock).
        taking = [s.split()[0] for s in seen if "PRAGMA busy_timeout" not in s]
        assert taking == ["UPDATE"], seen
        after = {w.id: w.heartbeat_at for w in backend.worker_list()}[WORKER.id]
        assert after > before
        # A worker pruned while it was paused comes back on its next beat.
        holder.execute("DELETE FROM jobkeeper_workers")
        backend.worker_heartbeat(worker=WORKER)
        assert [w.id for w in backend.worker_list()] == [WORKER.id]
        # Under another process's write lock the beat waits for the lock, and
        # fails cleanly (nothing half-written) when it never comes.
        _lock(holder)
        with pytest.raises(DatabaseError, match="locked"):
            backend.worker_heartbeat(worker=WORKER)
        holder.execute("ROLLBACK")
        backend.worker_heartbeat(worker=WORKER)
        beat = {w.id: w.heartbeat_at for w in backend.worker_list()}[WORKER.id]
        assert beat > datetime.now(UTC) - timedelta(seconds=5)
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("probe", "index"),
    [
        ("job_claim_probe", "jobkeeper_jobs_claim_idx"),
        ("job_stage_due_probe", "jobkeeper_jobs_due_idx"),
        ("job_prune_finished_probe", "jobkeeper_jobs_finished_idx"),
    ],
)
def test_probes_search_their_index_instead_of_scanning_the_table(locked_queue, probe, index):
    """A probe runs on every poll: a table scan would cost O(finished rows)
    each time (written as EXISTS (...), the claim probe scanned, and a SQLite
    drain of 1 M jobs slowed to ~600 jobs/s as completed rows piled up).
    """
    jq, holder = locked_queue
    jq.enqueue("t", {})
    # The statistics of a table analyzed when every one of its 1 M jobs was
    # available (the benchmark's fill, then ANALYZE): with these, SQLite
    # planned ``EXISTS (SELECT 1 ... WHERE status = 'available' ...)`` as a
    # scan of the whole table.
    holder.execute("ANALYZE")
    holder.execute("DELETE FROM sqlite_stat1")
    holder.execute(
        "INSERT INTO sqlite_stat1 VALUES "
        "('jobkeeper_jobs', 'jobkeeper_jobs_claim_idx', '1000000 1000000 1000000 10000 1'), "
        "('jobkeeper_jobs', NULL, '1000000')"
    )
    conn = sqlite3.connect(jq.backend.path)  # a new connection reads the statistics
    try:
        params = {"queue": "default", "older_than": 3600, "queues": '["default"]', "now": None}
        rows = conn.execute("EXPLAIN QUERY PLAN " + QUERIES[probe], params).fetchall()
    finally:
        conn.close()
    plan = " / ".join(row[3] for row in rows)
    assert f"USING INDEX {index}" in plan, plan
    assert "SCAN jobkeeper_jobs" not in plan, plan
