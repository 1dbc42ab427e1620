"""C-04 (pgqueuer#630): a SIGTERM (or SIGINT) stop must not leave running
jobs held by the stopped worker.

An async task awaiting a 60 s sleep and a sync task in one plain blocking
60 s ``time.sleep``, three of each, are running when the worker is told to
stop with a 2 s grace. Each is handed back within the grace (plus the moment
its interrupt takes): available again, its attempt not spent, a "shutdown"
note in its errors; nothing stays running under the stopped worker, which
exits 0 and deregisters, and a new worker takes them at once (rescue_after is
120 s, far beyond the deadline).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from e2e.helpers import holder_pid, processes, read_records, wait_exit
from jobkeeper import JobStatus
from support.db import sql
from support.settings import SHUTDOWN
from support.waiting import DEADLINE, wait_for, wait_status
from worker.helpers import running


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_c04_shutdown_hands_back_blocking_and_async_sleeps(make_queue, tmp_path, signum):
    jq = make_queue()
    url = jq.url.url
    record = tmp_path / "runs.log"
    args = {"seconds": 60, "record": str(record)}
    # "sleep" is one time.sleep(60) call; "asleep" awaits asyncio.sleep(60).
    ids = [j.id for j in jq.enqueue_many([("sleep", args)] * 3 + [("asleep", args)] * 3)]
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
        # shutdown_grace is 2 s; the timeout only bounds a hang.
        assert wait_exit(first, timeout=30) == 0, procs.log(first)
        for job_id in ids:
            j = jq.get_job(job_id)
            assert j is not None
            assert j.status in (JobStatus.AVAILABLE, JobStatus.RETRYABLE), j
            assert j.worker_id is None
            assert j.attempt == 0, "the interrupted attempt must not be spent"
            assert "shutdown" in j.errors[-1]["error"], j.errors
        held = sql(
            url, "SELECT count(*) FROM jobkeeper_jobs WHERE status IN ('claimed', 'running')"
        )
        assert held[0][0] == 0
        assert jq.workers() == []  # it deregistered

        second = procs.worker(url, SHUTDOWN, concurrency=6)
        wait_for(
            lambda: all(holder_pid(url, i) == second.pid for i in ids),
            timeout=30,
            what="the second worker to claim every handed-back job",
        )
        for job_id in ids:
            got = jq.get_job(job_id)
            assert got is not None and got.attempt == 1
    # No attempt ran to its end: every one was interrupted or killed.
    assert not [r for r in read_records(record) if r[3] == "end"]


def test_c04_time_sleep_in_a_task_ends_at_its_timeout_and_cancel(make_queue):
    # The same interrupt a stop sends, from a timeout and from a cancel: a
    # task in one long time.sleep returns when asked, not 60 s later.
    jq = make_queue()
    started = threading.Event()

    @jq.task(timeout=0.3, max_attempts=1)
    def times_out() -> None:
        time.sleep(60)

    @jq.task
    def cancelled() -> None:
        started.set()
        time.sleep(60)

    t = times_out.enqueue()
    c = cancelled.enqueue()
    with running(jq.worker(concurrency=2)):
        assert started.wait(DEADLINE)
        wait_status(jq, [c.id], {JobStatus.RUNNING})
        jq.cancel(c.id)
        # Well under the 60 s sleeps: each ends when its code is asked to stop.
        dead, gone = wait_status(
            jq, [t.id, c.id], {JobStatus.DEAD, JobStatus.CANCELLED}, timeout=30
        )
    assert dead.status == JobStatus.DEAD and "JobTimeout" in dead.errors[0]["error"]
    assert gone.status == JobStatus.CANCELLED
    # Outside a task, time.sleep is the original, refusals included.
    with pytest.raises(ValueError):
        time.sleep(-1)
    before = time.monotonic()
    time.sleep(0.05)
    assert time.monotonic() - before >= 0.05
