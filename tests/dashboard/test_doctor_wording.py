"""What ``jobkeeper doctor`` says about settings and silent workers agrees
with what jobkeeper does (newcomer break-test: it called an accepted
``rescue_after`` wrong, and said the jobs of a fleet's only, SIGKILLed,
worker "are being rescued" with nobody left to rescue them).
"""

from __future__ import annotations

import pytest

from backends.helpers import register
from jobkeeper import ConfigError, JobQueue
from jobkeeper.config import MIN_RESCUE_BEATS, RECOMMENDED_RESCUE_BEATS
from jobkeeper.doctor import run_checks
from support.db import is_pg, sql


def _settings_check(db_url: str, **settings: float) -> tuple[str, str]:
    with JobQueue(db_url, **settings) as jq:
        jq.migrate()
        check = {c.name: c for c in run_checks(jq)}["settings"]
    return check.level, check.message


def test_the_least_accepted_rescue_after_is_recommended_against_not_called_wrong(db_url):
    # JobQueue accepts MIN_RESCUE_BEATS heartbeats and refuses fewer: doctor
    # must not tell the user to "make it" something else for an accepted value.
    with pytest.raises(ConfigError, match=f"at least {MIN_RESCUE_BEATS} x"):
        JobQueue(db_url, heartbeat_interval=5, rescue_after=5 * MIN_RESCUE_BEATS - 1)
    level, message = _settings_check(
        db_url, heartbeat_interval=5, rescue_after=5 * MIN_RESCUE_BEATS
    )
    assert level == "warn"
    assert "make it" not in message and "allowed" in message
    assert f"{RECOMMENDED_RESCUE_BEATS} x heartbeat_interval or more is recommended" in message
    assert "more than 10 s late" in message  # 15 s window, a beat due every 5 s
    level, message = _settings_check(
        db_url, heartbeat_interval=5, rescue_after=5 * RECOMMENDED_RESCUE_BEATS
    )
    assert level == "ok", message


def _silence(jq: JobQueue, worker_id: str) -> None:
    """Makes ``worker_id`` silent for 10 minutes (past every window)."""
    shift = "heartbeat_at - interval '10 minutes'" if is_pg(jq) else "heartbeat_at - 600"
    sql(jq, f"UPDATE jobkeeper_workers SET heartbeat_at = {shift} WHERE id = ?", [worker_id])


def test_doctor_says_who_rescues_the_jobs_of_silent_workers(jq):
    register(jq, "killed-1")
    _silence(jq, "killed-1")
    check = {c.name: c for c in run_checks(jq)}["workers"]
    # The only worker was SIGKILLed: nobody rescues anything until one runs.
    assert check.level == "warn" and "1 of 1 worker(s)" in check.message
    assert "being rescued" not in check.message
    assert "will be rescued when a worker runs" in check.message
    register(jq, "alive-1")
    check = {c.name: c for c in run_checks(jq)}["workers"]
    assert check.level == "warn" and "1 of 2 worker(s)" in check.message
    assert "the live workers rescue their jobs" in check.message
