"""The warning about a timed-out attempt says what is known: it comes only
when the code has not returned after the interrupt had its chance.

Newcomer break-test: ``@jq.task(timeout=2) def slow(seconds): time.sleep(seconds)``
run with ``seconds=10`` logged "passed its timeout of 2s and has not returned;
... its slot stays busy and the job held until its code returns" in the same
millisecond as the failure, although the interrupted sleep had returned.
"""

from __future__ import annotations

import logging
import select
import time

import pytest

from jobkeeper import JobStatus
from jobkeeper.worker.interrupts import NOT_RETURNED_AFTER
from support.waiting import wait_for, wait_status

from .helpers import running

NOT_RETURNED = "has not returned"


def _warnings(caplog: pytest.LogCaptureFixture, needle: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and needle in r.getMessage()]


def test_a_timeout_whose_sleep_ends_at_once_logs_no_not_returned_warning(make_queue, caplog):
    jq = make_queue()

    @jq.task(timeout=0.3, max_attempts=1)
    def slow(seconds: float) -> None:
        time.sleep(seconds)

    j = slow.enqueue(seconds=10)
    with caplog.at_level(logging.WARNING, logger="jobkeeper"), running(jq.worker()):
        dead = wait_status(jq, [j.id], {JobStatus.DEAD})[0]
        # The worker runs on past the moment the warning would come.
        time.sleep(NOT_RETURNED_AFTER + 0.5)
    assert "JobTimeout" in dead.errors[0]["error"]
    assert _warnings(caplog, NOT_RETURNED) == []


def test_code_stuck_past_its_timeout_is_warned_about_while_it_has_not_returned(make_queue, caplog):
    jq = make_queue()
    stuck_for = NOT_RETURNED_AFTER + 1.5

    @jq.task(timeout=0.2, max_attempts=1)
    def stuck() -> None:
        select.select([], [], [], stuck_for)  # a C call: no interrupt ends it

    j = stuck.enqueue()
    with caplog.at_level(logging.WARNING, logger="jobkeeper"), running(jq.worker()):
        wait_status(jq, [j.id], {JobStatus.RUNNING})
        (warning,) = wait_for(lambda: _warnings(caplog, NOT_RETURNED), what="the warning")
        # Said while the code still ran, a second after the interrupt.
        assert jq.get_job(j.id).status == JobStatus.RUNNING
        assert "its slot stays busy and the job held" in warning.getMessage()
        assert "timeout of 0.2s" in warning.getMessage()
        dead = wait_status(jq, [j.id], {JobStatus.DEAD})[0]
    assert "past its timeout" in dead.errors[0]["error"]
    assert len(_warnings(caplog, NOT_RETURNED)) == 1
