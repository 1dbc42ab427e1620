"""The worker process's log on stderr: a stream that stops taking lines never
stops the worker, and what a task logs itself carries its job's fields, on
both backends, with real worker processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from jobkeeper import JobStatus
from support.waiting import wait_status

pytestmark = pytest.mark.slow

APP = """
import logging
from jobkeeper import JobQueue
jq = JobQueue(heartbeat_interval=0.5, rescue_after=3, shutdown_grace=2)
log = logging.getLogger("app")

@jq.task
def chatty(lines: int) -> int:
    for i in range(lines):
        log.warning("line %d of a chatty task", i)
    return lines

@jq.task
def loud() -> None:
    raise ValueError("E" * 200_000)

@jq.task(timeout=1, max_attempts=1)
def babbling() -> None:
    while True:
        log.warning("still going")

@jq.task
def quick() -> None:
    return None

@jq.task
def noted() -> None:
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("a task's own error")
"""

#: An attempt's outcome written (enqueued here, the failing jobs have the
#: default max_attempts: the failure leaves them retryable).
DONE = {JobStatus.COMPLETED, JobStatus.RETRYABLE}


def start_worker(db_url: str, tmp_path, *extra: str) -> subprocess.Popen[bytes]:
    (tmp_path / "logapp.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "JOBKEEPER_DATABASE_URL": db_url}
    argv = [sys.executable, "-m", "jobkeeper", "worker", "--app", "logapp:jq", *extra]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_stderr_nobody_reads_stops_no_job_and_no_sigterm(make_queue, tmp_path):
    # Break-test: with stderr a full pipe (a log shipper that stopped
    # reading) every logging call blocked: jobs that ended were never
    # written, the heartbeat kept them from a rescue, and SIGTERM's own log
    # line blocked too, so only SIGKILL ended the worker.
    jq = make_queue()
    ids = [j.id for j in jq.enqueue_many([("loud", {})] * 20 + [("chatty", {"lines": 30_000})])]
    worker = start_worker(jq.url.url, tmp_path, "--concurrency", "2")
    try:
        # Nobody reads its stderr yet: the pipe (64 kB) fills at once.
        try:
            done = wait_status(jq, ids, DONE)
        except AssertionError:
            worker.kill()
            raise AssertionError(worker.communicate(timeout=30)[1][-3000:]) from None
        assert {j.status for j in done} == DONE
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=30)
    assert worker.returncode == 0, err[-2000:]
    text = err.decode(errors="replace")
    assert "log lines dropped: stderr did not take them" in text, text[-2000:]
    assert "stopped" in text.splitlines()[-1], text[-2000:]


def test_a_tasks_own_lines_carry_its_job(make_queue, tmp_path):
    jq = make_queue()
    chatty = jq.enqueue("chatty", {"lines": 2})
    noted = jq.enqueue("noted", {})
    worker = start_worker(jq.url.url, tmp_path, "--burst", "--log-format", "json")
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err[-2000:]
    lines = [json.loads(line) for line in err.decode().splitlines() if line.strip()]
    own = [line for line in lines if line["logger"] == "app"]
    chatter = [line for line in own if line["message"].startswith("line ")]
    assert [line["message"] for line in chatter] == [
        "line 0 of a chatty task",
        "line 1 of a chatty task",
    ]
    for line in chatter:
        assert (line["job_id"], line["task"], line["queue"], line["attempt"]) == (
            chatty.id,
            "chatty",
            "default",
            1,
        )
    (error,) = [line for line in own if line["message"] == "a task's own error"]
    assert error["job_id"] == noted.id and error["task"] == "noted"
    assert "ZeroDivisionError" in error["exception"]
    # The worker's own lines outside any job carry none.
    (started,) = [line for line in lines if " started on " in line["message"]]
    assert "job_id" not in started


def test_a_task_interrupted_while_it_logs_stops_nothing_else(make_queue, tmp_path):
    # Break-test (helper-90): a timeout or shutdown interrupts a task's code
    # with an asynchronous exception; landing in logging's Handler.release
    # it left the handler's lock held, and every thread that logged after,
    # the stop's included, waited for ever (the job running under a live
    # heartbeat, SIGTERM ignored).
    jq = make_queue()
    babbling = [j.id for j in jq.enqueue_many([("babbling", {}, {"max_attempts": 1})] * 3)]
    quick = [j.id for j in jq.enqueue_many([("quick", {})] * 20)]
    worker = start_worker(jq.url.url, tmp_path, "--concurrency", "2")
    try:
        reader = threading.Thread(target=worker.communicate, daemon=True)
        reader.start()  # stderr read: only the lock can hold it up here
        wait_status(jq, quick, {JobStatus.COMPLETED})
        wait_status(jq, babbling, {JobStatus.DEAD})
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
