"""How the producer logs a staging or claim step that lost a race (a
serialization failure or deadlock): a warning naming the step, no traceback.
A break-test under ``default_transaction_isolation = 'serializable'`` saw
a 40001 in ``job_stage_due`` logged at ERROR as "claim failed; retrying"
with its whole traceback.
"""

from __future__ import annotations

import logging

import pytest

from jobkeeper import DatabaseError, DatabaseUnavailable
from jobkeeper.worker.reruns import again_if_closed_idle
from support.waiting import wait_for

from .helpers import running

ABORTED = (
    "PostgreSQL aborted the transaction (could not serialize access due to read/write "
    "dependencies among transactions); running it again may succeed"
)


@pytest.mark.parametrize(
    ("operation", "step"), [("job_stage_due", "staging due jobs"), ("job_claim", "claim")]
)
def test_a_lost_race_is_a_warning_naming_the_step(make_queue, caplog, operation, step):
    jq = make_queue()
    worker = jq.worker(concurrency=1)
    real = getattr(worker._backend, operation)
    calls: list[int] = []

    def aborted_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise DatabaseError(ABORTED, retry_asked=True)
        return real(**kwargs)

    setattr(worker._backend, operation, aborted_once)
    caplog.set_level(logging.INFO, logger="jobkeeper")
    with running(worker):
        wait_for(lambda: len(calls) >= 3)
    raced = [r for r in caplog.records if "lost a race" in r.getMessage()]
    assert len(raced) == 1
    assert raced[0].levelno == logging.WARNING
    assert raced[0].exc_info is None
    assert raced[0].getMessage().startswith(f"{step} lost a race with another transaction")
    assert ABORTED in raced[0].getMessage()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_any_other_database_error_keeps_its_traceback_and_names_the_step(make_queue, caplog):
    jq = make_queue()
    worker = jq.worker(concurrency=1)
    real = worker._backend.job_stage_due
    calls: list[int] = []

    def broken_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise DatabaseError("PostgreSQL error: something unexpected")
        return real(**kwargs)

    worker._backend.job_stage_due = broken_once
    caplog.set_level(logging.INFO, logger="jobkeeper")
    with running(worker):
        wait_for(lambda: len(calls) >= 3)
    failed = [r for r in caplog.records if r.getMessage() == "staging due jobs failed; retrying"]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR
    assert failed[0].exc_info is not None


CLOSED = (
    "PostgreSQL at ... closed the session: terminating connection due to idle-session "
    "timeout (idle_session_timeout: ...; nothing of the call was written)"
)


@pytest.mark.parametrize("times", [1, 2])
def test_a_session_closed_while_idle_is_run_again_once_without_a_warning(make_queue, caplog, times):
    jq = make_queue()
    worker = jq.worker(concurrency=1)
    real = worker._backend.job_stage_due
    calls: list[int] = []

    def closed(**kwargs):
        calls.append(1)
        if len(calls) <= times:
            raise DatabaseUnavailable(CLOSED, unreachable=False, retry_asked=True)
        return real(**kwargs)

    worker._backend.job_stage_due = closed
    caplog.set_level(logging.DEBUG, logger="jobkeeper")
    with running(worker):
        wait_for(lambda: len(calls) >= times + 2)
    reruns = [r for r in caplog.records if "running it again at once" in r.getMessage()]
    assert [r.levelno for r in reruns] == [logging.DEBUG]
    assert reruns[0].getMessage().startswith("staging due jobs: ")
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if times == 1:
        assert warned == []
    else:  # a second in a row is no race at the check: said as any failure
        assert len(warned) == 1 and warned[0].startswith("staging due jobs failed (")
        assert "database unavailable" not in warned[0]


def test_again_if_closed_idle_runs_the_call_once_more_only_for_a_closed_session():
    calls: list[int] = []

    def closed_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise DatabaseUnavailable(CLOSED, unreachable=False, retry_asked=True)
        return "written"

    assert again_if_closed_idle(closed_once) == "written" and len(calls) == 2

    def down() -> str:
        calls.append(1)
        raise DatabaseUnavailable("PostgreSQL at ... is unavailable: connection refused")

    calls.clear()
    with pytest.raises(DatabaseUnavailable, match="connection refused"):
        again_if_closed_idle(down)
    assert len(calls) == 1
