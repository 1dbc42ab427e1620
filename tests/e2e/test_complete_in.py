"""complete_in: a task's own database write and its job's completion in one
transaction, fenced on the claim, with real worker processes on both
backends (tests/e2e/tx_app.py is their app).
"""

from __future__ import annotations

import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobkeeper import JobQueue, JobStatus
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for

from .helpers import Procs, holder_pid, processes, workers_by_pid

pytestmark = pytest.mark.slow

APP = "tests.e2e.tx_app:jq"


def worker(
    procs: Procs, url: str, settings: dict[str, Any], concurrency: int = 1, queue: str = "default"
) -> Any:
    argv = [sys.executable, "-m", "jobkeeper", "--database", url, "worker", "--app", APP]
    argv += ["--concurrency", str(concurrency), "--queue", queue]
    return procs.spawn(argv, settings=settings, name="worker")


def records(path: Path) -> list[tuple[int, int, int, int, str, str]]:
    """``(job id, attempt, fence, pid, event, idempotency key)`` per line."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        job_id, attempt, fence, pid, event, key = line.split()
        out.append((int(job_id), int(attempt), int(fence), int(pid), event, key))
    return out


def effects(url: str) -> list[tuple[int, int, int, int]]:
    rows = sql(url, "SELECT job_id, attempt, fence, pid FROM effects ORDER BY job_id, attempt")
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in rows]


def setup(make_queue: Any, **settings: Any) -> tuple[JobQueue, str]:
    jq = make_queue(**settings)
    url = jq.url.url
    sql(url, "CREATE TABLE effects (job_id bigint, attempt int, fence bigint, pid int)")
    return jq, url


def done(jq: JobQueue, job_id: int) -> Any:
    job = jq.get_job(job_id)
    return job if job is not None and job.status == JobStatus.COMPLETED else None


def test_row_and_completion_commit_together(make_queue, tmp_path):
    jq, url = setup(make_queue)
    record = tmp_path / "runs.log"
    jobs = [jq.enqueue("pay", {"url": url, "record": str(record)}) for _ in range(3)]
    with processes(tmp_path) as procs:
        a = worker(procs, url, FAST, concurrency=2)
        finished = [wait_for(lambda j=j: done(jq, j.id), what=f"job {j.id}") for j in jobs]
        # The task notes "committed" after its commit, which the test may
        # see first: the worker is stopped only once every task noted it.
        wait_for(
            lambda: len([r for r in records(record) if r[4] == "committed"]) == 3,
            what="three committed notes",
        )
        assert a.poll() is None
        assert "claim lost" not in procs.log(a)
    # Exactly one row per job, each from the attempt that completed it.
    assert effects(url) == sorted((j.id, 1, 1, a.pid) for j in jobs)
    for job in finished:
        assert job.result == {"by": a.pid, "attempt": 1}  # complete_in's, not the return
        assert job.errors == []
    keys = [r[5] for r in records(record) if r[4] == "committed"]
    assert len(set(keys)) == 3
    assert all(key.startswith("jk-") and len(key) <= 80 for key in keys)


def test_with_retention_zero_the_job_is_deleted_with_the_commit(make_queue, tmp_path):
    settings = {**FAST, "retention": 0}
    jq, url = setup(make_queue, **settings)
    record = tmp_path / "runs.log"
    job = jq.enqueue("pay", {"url": url, "record": str(record), "raise_after_commit": True})
    with processes(tmp_path) as procs:
        a = worker(procs, url, settings)
        wait_for(lambda: "completed by complete_in" in procs.log(a), what="the note in A's log")
        assert jq.get_job(job.id) is None
        assert "claim lost" not in procs.log(a)
    assert effects(url) == [(job.id, 1, 1, a.pid)]


def test_rollback_after_complete_in_leaves_the_job_to_the_worker(make_queue, tmp_path):
    jq, url = setup(make_queue)
    record = tmp_path / "runs.log"
    job = jq.enqueue("pay", {"url": url, "record": str(record), "rollback_attempts": 2})
    with processes(tmp_path) as procs:
        worker(procs, url, FAST)
        final = wait_for(lambda: done(jq, job.id), what="the job completed")
    # Attempts 1 and 2 rolled back their row and raised: two failed attempts
    # on record, and only attempt 3's row and completion.
    assert final.attempt == 3
    assert [e["attempt"] for e in final.errors] == [1, 2]
    assert "failed after complete_in" in final.errors[0]["error"]
    assert [(row[0], row[1]) for row in effects(url)] == [(job.id, 3)]
    assert final.result["attempt"] == 3
    runs = records(record)
    # One idempotency key over all attempts; the fence grows with every claim.
    assert len({r[5] for r in runs}) == 1
    fences = [r[2] for r in runs if r[4] == "waiting"]
    assert fences == sorted(fences) and len(set(fences)) == 3


def test_return_after_rollback_completes_with_the_return_value(make_queue, tmp_path):
    jq, url = setup(make_queue)
    record = tmp_path / "runs.log"
    job = jq.enqueue("pay", {"url": url, "record": str(record), "rollback_then_return": True})
    with processes(tmp_path) as procs:
        worker(procs, url, FAST)
        final = wait_for(lambda: done(jq, job.id), what="the job completed")
    assert final.attempt == 1 and final.errors == []
    assert final.result == {"returned": "after a rollback"}
    assert effects(url) == []


def test_exception_after_commit_is_not_a_failure(make_queue, tmp_path):
    jq, url = setup(make_queue)
    record = tmp_path / "runs.log"
    job = jq.enqueue("pay", {"url": url, "record": str(record), "raise_after_commit": True})
    with processes(tmp_path) as procs:
        a = worker(procs, url, FAST)
        final = wait_for(lambda: done(jq, job.id), what="the job completed")
        wait_for(lambda: "completed by complete_in" in procs.log(a), what="the note in A's log")
        assert "claim lost" not in procs.log(a)
        assert "will be retried" not in procs.log(a)
    assert final.attempt == 1 and final.errors == []
    assert final.result == {"by": a.pid, "attempt": 1}
    assert len(effects(url)) == 1


def _sqlite_write_lock_free(url: str) -> bool:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0.5, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def test_sigstopped_holder_gets_claim_lost_and_its_row_rolls_back(make_queue, tmp_path):
    jq, url = setup(make_queue)
    record = tmp_path / "runs.log"
    gate = tmp_path / "go"
    job = jq.enqueue("pay", {"url": url, "record": str(record), "gate": str(gate)})
    with processes(tmp_path) as procs:
        a = worker(procs, url, FAST)
        wait_for(
            lambda: (
                any(r[4] == "waiting" for r in records(record))
                and jq.get_job(job.id).status == JobStatus.RUNNING  # its start mark written
            ),
            what="A waits",
        )
        for _ in range(50):
            a.send_signal(signal.SIGSTOP)
            # Frozen inside a SQLite write transaction, A would block every
            # writer (an inherent SQLite limit): freeze it again elsewhere.
            if not url.startswith("sqlite") or _sqlite_write_lock_free(url):
                break
            a.send_signal(signal.SIGCONT)
            time.sleep(0.03)
        else:
            raise AssertionError("could not freeze A outside a write transaction")
        b = worker(procs, url, FAST)
        # B rescues the job from the silent A and runs attempt 2; it waits
        # at its gate, holding the job, while A comes back.
        wait_for(
            lambda: (
                any(r[3] == b.pid and r[4] == "waiting" for r in records(record))
                and jq.get_job(job.id).status == JobStatus.RUNNING
            ),
            what="B to run attempt 2",
        )
        a.send_signal(signal.SIGCONT)
        # Back, A learns its claim is gone and asks its task to stop; the
        # task ignores that (as C code would) and goes on to complete_in,
        # while B runs the job (River's state-only fence would let it in).
        wait_for(lambda: "asked its code to stop" in procs.log(a), what="A's interrupt")
        (tmp_path / "go-1").touch()
        wait_for(
            lambda: any(r[3] == a.pid and r[4] == "claim_lost" for r in records(record)),
            what="A's complete_in to raise ClaimLost",
        )
        assert jq.get_job(job.id).status == JobStatus.RUNNING and holder_pid(url, job.id) == b.pid
        assert effects(url) == []
        (tmp_path / "go-2").touch()
        final = wait_for(lambda: done(jq, job.id), what="B to complete the job")
        assert final.result == {"by": b.pid, "attempt": 2}
        assert a.poll() is None, "A must survive its lost claim"
        assert a.pid in workers_by_pid(url)
        assert holder_pid(url, job.id) is None
    # Exactly once: B's row only; A's was rolled back with its transaction.
    assert effects(url) == [(job.id, 2, 2, b.pid)]
    final = done(jq, job.id)
    assert final.attempt == 2 and final.result == {"by": b.pid, "attempt": 2}
    runs = records(record)
    assert {r[5] for r in runs} == {runs[0][5]}  # one key for both attempts
    assert {(r[1], r[2], r[3]) for r in runs if r[4] == "waiting"} == {(1, 1, a.pid), (2, 2, b.pid)}


def test_long_transaction_gets_no_live_job_rescued(make_queue, tmp_path):
    # The task holds its transaction (on SQLite: the database's one write
    # lock, which the worker's own heartbeat then waits for) for many
    # heartbeat intervals and three times rescue_after, while the same
    # worker runs another job and another worker's rescuer judges them.
    settings = {**FAST, "heartbeat_interval": 0.2, "rescue_after": 1.0}
    jq, url = setup(make_queue, **settings)
    record = tmp_path / "runs.log"
    gate = tmp_path / "go"
    with processes(tmp_path) as procs:
        # B claims from another queue: its rescuer judges A's jobs all along.
        b = worker(procs, url, settings, queue="elsewhere")
        wait_for(lambda: b.pid in workers_by_pid(url), what="B registered")
        beside = jq.enqueue("nap", {"seconds": 6.0})
        long_tx = jq.enqueue(
            "pay", {"url": url, "record": str(record), "hold": 3.0, "gate": str(gate)}
        )
        a = worker(procs, url, settings, concurrency=2)
        wait_for(
            lambda: all(
                holder_pid(url, j.id) == a.pid and jq.get_job(j.id).status == JobStatus.RUNNING
                for j in (beside, long_tx)
            ),
            what="A runs both jobs",
        )
        (tmp_path / "go-1").touch()
        final = wait_for(lambda: done(jq, long_tx.id), what="the long transaction's job")
        other = wait_for(lambda: done(jq, beside.id), what="the job beside it")
        assert "rescued" not in procs.log(b)
    assert final.attempt == 1 and final.errors == [], final.errors
    assert final.result == {"by": a.pid, "attempt": 1}
    assert effects(url) == [(long_tx.id, 1, 1, a.pid)]
    assert other.errors == [], other.errors
    assert other.attempt == 1
    assert other.result == "rested"
