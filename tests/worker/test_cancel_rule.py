"""A job cancelled while it runs ends cancelled whatever its
attempt does next, unless the attempt succeeds first, even when the worker
has not noticed the request yet (its cancel poll rides on the heartbeat,
made slow here so the task always ends first).
"""

from __future__ import annotations

import threading

import pytest

from jobkeeper import JobStatus, Retry
from support.db import job
from support.settings import SLOW_HEARTBEAT
from support.waiting import wait_status

from .helpers import running


@pytest.mark.parametrize(
    ("ending", "max_attempts", "expected"),
    [
        ("raise", 5, JobStatus.CANCELLED),
        ("retry", 5, JobStatus.CANCELLED),
        ("raise", 1, JobStatus.CANCELLED),  # its last attempt: not dead
        ("return", 5, JobStatus.COMPLETED),  # the work was done
    ],
)
def test_a_cancel_request_decides_the_outcome_unless_the_attempt_succeeds(
    make_queue, ending, max_attempts, expected
):
    jq = make_queue(**SLOW_HEARTBEAT)
    gate = threading.Event()

    @jq.task
    def obeys(ending: str) -> str:
        gate.wait(30)
        if ending == "raise":
            raise RuntimeError("failed after the cancel request")
        if ending == "retry":
            raise Retry(delay=0)
        return "done"

    j = jq.enqueue("obeys", {"ending": ending}, max_attempts=max_attempts)
    with running(jq.worker(concurrency=1)):
        wait_status(jq, [j.id], {JobStatus.RUNNING})
        assert jq.cancel(j.id).cancel_requested
        gate.set()
        (done,) = wait_status(
            jq, [j.id], {JobStatus.CANCELLED, JobStatus.COMPLETED, JobStatus.RETRYABLE,
                         JobStatus.AVAILABLE, JobStatus.DEAD},
        )  # fmt: skip
    assert done.status == expected, done
    assert job(jq, j.id).status == expected
    assert done.attempt == 1
    if expected == JobStatus.CANCELLED:
        assert len(done.errors) == 1  # the attempt's error is kept
        assert done.finished_at is not None and done.worker_id is None
