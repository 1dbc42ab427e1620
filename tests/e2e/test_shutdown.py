"""Graceful shutdown of a worker process: SIGTERM and SIGINT."""

from __future__ import annotations

import signal

import pytest

from jobkeeper import JobStatus
from support.settings import SHUTDOWN
from support.waiting import wait_for

from .helpers import holder_pid, processes, read_records, wait_exit

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_hands_back_running_jobs_and_exits_0(make_queue, tmp_path, signum):
    jq = make_queue()
    url = jq.url.url
    record = tmp_path / "runs.log"
    args = {"seconds": 60, "record": str(record)}
    # Sync tasks nap in short sleeps: code stuck in one long C call does not
    # return when interrupted, and stays held instead (the test below).
    ids = [j.id for j in jq.enqueue_many([("asleep", args)] * 3 + [("naps", args)] * 3)]
    with processes(tmp_path) as procs:
        first = procs.worker(url, SHUTDOWN, concurrency=6)
        wait_for(
            lambda: (
                len({r[0] for r in read_records(record)}) == 6
                and all(holder_pid(url, i) == first.pid for i in ids)
            ),
            what="all six jobs running in the first worker",
        )
        first.send_signal(signum)
        # grace 2 s; the deadline only bounds a hang.
        assert wait_exit(first, timeout=30) == 0, procs.log(first)
        for job_id in ids:
            j = jq.get_job(job_id)
            assert j.status == JobStatus.AVAILABLE, j
            assert j.worker_id is None
            assert j.attempt == 0, "the interrupted attempt must not be spent"
            assert len(j.errors) == 1 and "shutdown" in j.errors[0]["error"]
        assert jq.workers() == []  # it deregistered

        second = procs.worker(url, SHUTDOWN, concurrency=6)
        # Picked up at once: rescue_after (120 s) is far beyond this deadline.
        wait_for(
            lambda: all(holder_pid(url, i) == second.pid for i in ids),
            timeout=30,
            what="the second worker to claim every handed-back job",
        )
        for job_id in ids:
            assert jq.get_job(job_id).attempt == 1
    assert not [r for r in read_records(record) if r[3] == "end"]


def test_a_stop_leaves_code_stuck_in_c_held_until_its_rescue(make_queue, tmp_path):
    # Past the grace period the worker interrupts its job, whose code sleeps
    # in C and does not return: the job is not handed back (another worker
    # would start it beside the still-running code). The worker exits 1 with
    # the job held under its id and its row kept; once its heartbeat is
    # rescue_after old, another worker rescues the job (the attempt counted).
    jq = make_queue()
    url = jq.url.url
    record = tmp_path / "runs.log"
    settings = {**SHUTDOWN, "rescue_after": 3.0, "shutdown_grace": 0.5}
    stuck = jq.enqueue("stuck_once", {"seconds": 60, "record": str(record)})
    with processes(tmp_path) as procs:
        first = procs.worker(url, settings, concurrency=1)
        wait_for(lambda: read_records(record), what="the first attempt to start")
        first.send_signal(signal.SIGTERM)
        assert wait_exit(first, timeout=30) == 1, procs.log(first)
        assert "stay held by this worker" in procs.log(first)
        held = jq.get_job(stuck.id)
        assert held.status == JobStatus.RUNNING and held.attempt == 1, held
        assert held.errors == []
        assert [w.pid for w in jq.workers()] == [first.pid]  # not deregistered

        second = procs.worker(url, settings, concurrency=1)
        done = wait_for(
            lambda: (j := jq.get_job(stuck.id)).status == JobStatus.COMPLETED and j,
            timeout=30,
            what="the rescue and the second attempt",
        )
        second.send_signal(signal.SIGTERM)
        assert wait_exit(second, timeout=30) == 0, procs.log(second)
    assert done.attempt == 2 and done.result == 2
    assert len(done.errors) == 1, done.errors  # the lost worker, recorded by the rescue
    assert [(r[1], r[3]) for r in read_records(record)] == [(1, "start"), (2, "start"), (2, "end")]
