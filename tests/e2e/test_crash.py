"""Worker processes that die or freeze mid-job: SIGKILL, a poison job that
kills its worker (a crash spends an attempt), and a SIGSTOPped zombie whose late ack is fenced.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest

from jobkeeper import JobStatus
from jobkeeper.maintenance.rescuer import Rescuer
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for

from .helpers import holder_pid, processes, read_records, wait_exit, workers_by_pid

pytestmark = pytest.mark.slow


def _held_by(url: str, pid: int) -> set[int]:
    rows = sql(
        url, "SELECT id, worker_id FROM jobkeeper_jobs WHERE status IN ('claimed', 'running')"
    )
    return {int(job_id) for job_id, wid in rows if int(str(wid).split(":")[-2]) == pid}


def test_sigkill_mid_job_is_rescued_counted_and_completed(make_queue, tmp_path):
    jq = make_queue()
    url = jq.url.url
    record = tmp_path / "runs.log"
    ids = [j.id for j in jq.enqueue_many([("sleep", {"seconds": 1.0, "record": str(record)})] * 6)]
    with processes(tmp_path) as procs:
        a = procs.worker(url, FAST, concurrency=3)
        wait_for(
            lambda: len([r for r in read_records(record) if r[2] == a.pid]) == 3,
            what="worker A to be running 3 jobs",
        )
        started = {r[0] for r in read_records(record) if r[2] == a.pid}
        # ...and their start marks recorded (claimed -> running).
        wait_for(
            lambda: all(jq.get_job(i).status == JobStatus.RUNNING for i in started),
            what="A's start marks",
        )
        a.send_signal(signal.SIGKILL)
        assert wait_exit(a) == -signal.SIGKILL
        lost = _held_by(url, a.pid)  # frozen: nobody is alive to rescue them yet
        started_by_a = {r[0] for r in read_records(record) if r[2] == a.pid}
        assert started_by_a <= lost and len(started_by_a) == 3

        b = procs.worker(url, FAST, concurrency=4)
        wait_for(
            lambda: all(jq.get_job(i).status == JobStatus.COMPLETED for i in ids),
            what="every job to complete",
        )
        assert b.poll() is None
    for job_id in ids:
        done = jq.get_job(job_id)
        assert done.result["pid"] == b.pid
        if job_id in started_by_a:
            assert done.attempt == 2, done
            assert len(done.errors) == 1
            assert done.errors[0]["attempt"] == 1
            assert "worker lost" in done.errors[0]["error"]
        elif job_id in lost:
            # Prefetched by A, never started: returned without spending.
            assert done.attempt == 1, done
            assert len(done.errors) == 1 and "not spent" in done.errors[0]["error"]
        else:
            assert done.attempt == 1 and done.errors == []
    # A's interrupted runs never finished; B ran every job to its end once.
    runs = read_records(record)
    assert not [r for r in runs if r[2] == a.pid and r[3] == "end"]
    ends = sorted(r[0] for r in runs if r[3] == "end")
    assert ends == sorted(ids)


def test_poison_job_that_kills_its_worker_ends_dead_after_max_attempts(make_queue, tmp_path):
    jq = make_queue()
    url = jq.url.url
    record = tmp_path / "runs.log"
    poison = jq.enqueue("suicide", {"record": str(record)}, max_attempts=3)
    deaths = 0
    with processes(tmp_path) as procs:
        workers = [procs.worker(url, FAST, concurrency=2) for _ in range(2)]

        def supervise() -> bool:
            # The supervisor: restart any worker that died.
            nonlocal deaths
            for index, proc in enumerate(workers):
                if proc.poll() is not None:
                    assert proc.returncode == -signal.SIGKILL, procs.log(proc)
                    deaths += 1
                    workers[index] = procs.worker(url, FAST, concurrency=2)
            return jq.get_job(poison.id).status == JobStatus.DEAD

        wait_for(supervise, timeout=90, what="the poison job to reach the dead letters")
        # The workers stop dying: both run an ordinary job and stay up.
        ok = [jq.enqueue("sleep", {"seconds": 0.01}).id for _ in range(4)]
        wait_for(
            lambda: supervise() and all(jq.get_job(i).status == JobStatus.COMPLETED for i in ok),
            what="ordinary jobs to complete",
        )
        assert all(proc.poll() is None for proc in workers)
    dead = jq.get_job(poison.id)
    assert dead.status == JobStatus.DEAD
    assert dead.attempt == 3
    assert all("worker lost" in e["error"] for e in dead.errors)
    # The first crash usually comes before the job's start mark is flushed:
    # the job looks prefetched and goes back with its attempt (no errors
    # entry: nothing failed that counts). Its next claims write the start
    # mark before the task runs, so from then on every crash spends an
    # attempt: one crash more at most.
    assert [e["attempt"] for e in dead.errors] == [1, 2, 3]
    returned = deaths - 3
    assert returned in (0, 1)
    assert [r[1] for r in read_records(record)] == [1] * returned + [1, 2, 3]


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


def test_sigstop_zombie_late_completion_is_fenced(make_queue, tmp_path):
    jq = make_queue()
    url = jq.url.url
    record = tmp_path / "runs.log"
    j = jq.enqueue("sleep", {"seconds": 2.0, "record": str(record)})
    with processes(tmp_path) as procs:
        a = procs.worker(url, FAST, concurrency=1)
        wait_for(
            lambda: (
                holder_pid(url, j.id) == a.pid
                and read_records(record)
                and jq.get_job(j.id).status == JobStatus.RUNNING
            ),  # its start recorded
            what="A runs",
        )
        for _ in range(50):
            a.send_signal(signal.SIGSTOP)
            # A frozen inside a SQLite write transaction would block every
            # writer (an inherent SQLite limit): freeze it again elsewhere.
            if not url.startswith("sqlite") or _sqlite_write_lock_free(url):
                break
            a.send_signal(signal.SIGCONT)
            time.sleep(0.03)
        else:
            raise AssertionError("could not freeze A outside a write transaction")

        b = procs.worker(url, FAST, concurrency=1)
        # B's rescuer sees A silent, rescues the job, and B claims attempt 2
        # and starts it: a claim alone shows CLAIMED until B's start mark.
        wait_for(
            lambda: (
                holder_pid(url, j.id) == b.pid
                and jq.get_job(j.id).status == JobStatus.RUNNING
                and any(r[1:] == (2, b.pid, "start") for r in read_records(record))
            ),
            what="B to run the job",
        )
        assert jq.get_job(j.id).attempt == 2
        a.send_signal(signal.SIGCONT)
        # A wakes, its task returns, and its completion is refused by the fence.
        wait_for(lambda: "claim lost" in procs.log(a), what="A's refused ack in its log")
        # A's refused ack left B's attempt alone (B may have finished it by now).
        now = jq.get_job(j.id)
        assert now.attempt == 2
        assert now.status == JobStatus.COMPLETED or holder_pid(url, j.id) == b.pid
        done = wait_for(
            lambda: (x := jq.get_job(j.id)).status == JobStatus.COMPLETED and x,
            what="B to complete the job",
        )
        assert a.poll() is None, "A must survive its lost claim"
        assert a.pid in workers_by_pid(url)
    assert done.result == {"pid": b.pid, "attempt": 2}
    assert done.attempt == 2
    assert len(done.errors) == 1 and "worker lost" in done.errors[0]["error"]
    assert done.errors[0]["attempt"] == 1
    # Both started (at-least-once), but only B's attempt was recorded. Back
    # from its pause, A learns its claim was rescued and asks its code to stop,
    # so A's attempt may not reach its end.
    runs = {(r[1], r[2], r[3]) for r in read_records(record)}
    assert {(1, a.pid, "start"), (2, b.pid, "start"), (2, b.pid, "end")} <= runs
    assert runs <= {(1, a.pid, "start"), (1, a.pid, "end"), (2, b.pid, "start"), (2, b.pid, "end")}
    assert os.getpid() not in {r[2] for r in runs}


def test_prefetched_jobs_of_a_killed_worker_come_back_unspent(make_queue, tmp_path):
    # A worker at concurrency 1 with a deep prefetch holds
    # one started job and many it never started. They show claimed, not
    # running; when it is SIGKILLed only the started one spends an attempt:
    # the others (max_attempts=1) go back available at attempt 0 and then
    # complete, none dead.
    jq = make_queue()
    url = jq.url.url
    record = tmp_path / "runs.log"
    slow = jq.enqueue("sleep", {"seconds": 60.0, "record": str(record)})
    quick = [
        j.id
        for j in jq.enqueue_many(
            [("sleep", {"seconds": 0.01, "record": str(record)}, {"max_attempts": 1})] * 10
        )
    ]
    with processes(tmp_path) as procs:
        a = procs.worker(url, FAST, concurrency=1, prefetch=20)
        wait_for(lambda: jq.get_job(slow.id).status == JobStatus.RUNNING, what="A's slow job")
        wait_for(
            lambda: all(jq.get_job(i).status == JobStatus.CLAIMED for i in quick),
            what="A to prefetch the quick jobs",
        )
        counts = jq.stats()["default"]
        assert (counts["running"], counts["claimed"], counts["available"]) == (1, 10, 0)
        a.send_signal(signal.SIGKILL)
        assert wait_exit(a) == -signal.SIGKILL
        assert {r[0] for r in read_records(record)} == {slow.id}  # nothing else started

        # A rescuer (here in-process) returns them once A is silent long enough.
        rescuer = Rescuer(jq.backend, jq.settings, 0.1)

        def rescued() -> bool:
            rescuer.run_once()
            return all(jq.get_job(i).status == JobStatus.AVAILABLE for i in quick)

        wait_for(rescued, what="the prefetched jobs to be returned")
        for job_id in quick:
            back = jq.get_job(job_id)
            assert (back.attempt, back.unstarted_returns, back.worker_id) == (0, 1, None)
        lost = jq.get_job(slow.id)
        assert lost.status == JobStatus.RETRYABLE and lost.attempt == 1
        assert "while running attempt 1" in lost.errors[0]["error"]

        b = procs.worker(url, FAST, concurrency=4)
        wait_for(
            lambda: all(jq.get_job(i).status == JobStatus.COMPLETED for i in quick),
            what="B to complete the returned jobs",
        )
        assert b.poll() is None
    for job_id in quick:
        done = jq.get_job(job_id)
        assert done.attempt == 1 and done.result["pid"] == b.pid
    assert jq.stats()["default"].get("dead", 0) == 0
