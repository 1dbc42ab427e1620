"""What a task leaves behind in its worker process must not stop the worker
from working or from stopping: a closed ``sys.stderr`` (where its logs go),
a non-daemon thread still running (found by a break-test, helper-81).
"""

from __future__ import annotations

import signal

import pytest

from jobkeeper import JobQueue, JobStatus
from support.settings import FAST
from support.waiting import wait_status

from .helpers import processes, wait_exit

pytestmark = pytest.mark.slow


def test_a_task_that_closes_stderr_leaves_the_worker_working_and_stoppable(db_url, tmp_path):
    # A failure's log line met the closed stream and raised out of the
    # logging call: the runner thread died with the outcome undelivered, the
    # job stayed running under a live heartbeat, and SIGTERM did nothing.
    with JobQueue(db_url) as jq:
        jq.migrate()
        closer = jq.enqueue("close_stderr", {})
        failing = jq.enqueue("slept", {"seconds": 0, "fail_on": 1})
        after = jq.enqueue("sleep", {"seconds": 0})
        with processes(tmp_path) as procs:
            worker = procs.worker(db_url, FAST, concurrency=1)
            wait_status(jq, [closer.id, after.id], {JobStatus.COMPLETED})
            wait_status(jq, [failing.id], {JobStatus.RETRYABLE, JobStatus.COMPLETED})
            worker.send_signal(signal.SIGTERM)
            assert wait_exit(worker, timeout=30) == 0
        retried = jq.get_job(failing.id)
        assert retried is not None and "fails on attempt 1" in retried.errors[0]["error"]


def test_a_thread_a_task_left_running_does_not_keep_the_stopped_worker_alive(db_url, tmp_path):
    # The worker logged "stopped" and deregistered, then the interpreter
    # waited on the task's thread: the process lived on until a second signal.
    with JobQueue(db_url) as jq:
        jq.migrate()
        job = jq.enqueue("leave_thread", {"seconds": 3600})
        with processes(tmp_path) as procs:
            worker = procs.worker(db_url, FAST, concurrency=1)
            wait_status(jq, [job.id], {JobStatus.COMPLETED})
            worker.send_signal(signal.SIGTERM)
            assert wait_exit(worker, timeout=30) == 0
            log = procs.log(worker)
        assert "left-by-a-task" in log and "does not wait" in log


def test_an_async_pool_a_task_opened_is_closed_with_its_loop(db_url, tmp_path):
    # An async task's enqueue_async opens the queue's async pool on the
    # worker's task loop; the worker closed that loop with the pool open,
    # and every shutdown printed three "Exception ignored in
    # AsyncConnectionPool.worker ... RuntimeError: Event loop is closed".
    with JobQueue(db_url) as jq:
        jq.migrate()
        jobs = jq.enqueue_many([("enqueue_follow_ups", {"count": 3})] * 4)
        with processes(tmp_path) as procs:
            worker = procs.worker(db_url, FAST, concurrency=4)
            wait_status(jq, [job.id for job in jobs], {JobStatus.COMPLETED})
            worker.send_signal(signal.SIGTERM)
            assert wait_exit(worker, timeout=30) == 0
            log = procs.log(worker)
        assert len(jq.list_jobs(queue="followups", limit=100)) == 12
        assert "Exception ignored" not in log, log
        assert "Event loop is closed" not in log, log
        assert "Traceback" not in log, log
