"""A task's backoff function returning infinity or an int past float's range
falls back on the default backoff, as NaN does, on both backends; a huge
finite number is capped at about 100 years (docs/tasks.md).

Found by a break-test: ``backoff=lambda a, e: math.inf`` parked the job
36525 days ahead without a word, and ``10**400`` made the worker record
"internal error settling the attempt: OverflowError" instead of the task's
own error.
"""

from __future__ import annotations

import logging
import math

import pytest

from jobkeeper import JobQueue, JobStatus, current_job
from jobkeeper.backoff import ABSOLUTE_MAX_BACKOFF
from support.waiting import wait_status
from worker.helpers import running


def test_infinite_or_unrepresentable_backoff_uses_the_default(
    jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    def fails_once() -> None:
        if current_job().attempt == 1:
            raise KeyError("the task's own error")

    # The default backoff (FAST settings: under 0.05 s) brings each job back
    # at once, so it completes; a 100-year park would never let it.
    flaky_inf = jq.task(name="flaky_inf", backoff=lambda a, e: math.inf)(fails_once)
    flaky_big = jq.task(name="flaky_big", backoff=lambda a, e: 10**400)(fails_once)

    @jq.task(max_attempts=2, backoff=lambda a, e: 1e300)
    def flaky_huge() -> None:
        raise KeyError("the task's own error")

    jobs = [flaky_inf.enqueue(), flaky_big.enqueue(), flaky_huge.enqueue()]
    with caplog.at_level(logging.WARNING, "jobkeeper"), running(jq.worker(concurrency=3)):
        inf, big = wait_status(jq, [jobs[0].id, jobs[1].id], {JobStatus.COMPLETED})
        (huge,) = wait_status(jq, [jobs[2].id], {JobStatus.RETRYABLE})
    for job in (inf, big, huge):
        assert [e["error"] for e in job.errors] == ['KeyError: "the task\'s own error"']
    assert inf.attempt == big.attempt == 2
    assert "backoff function returned inf, not finite seconds" in caplog.text
    assert "backoff function returned 1000000" in caplog.text
    # A huge finite delay is capped at about 100 years, as documented.
    assert huge.finished_at is not None
    parked = (huge.scheduled_at - huge.finished_at).total_seconds()
    assert abs(parked - ABSOLUTE_MAX_BACKOFF) < 60
