"""Tasks of the results tests, loaded by worker subprocesses with
``--app tests.results.app:jq`` (settings from ``$JK_E2E_SETTINGS``)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobkeeper import JobQueue, Snooze, current_job

SETTINGS: dict[str, Any] = json.loads(os.environ.get("JK_E2E_SETTINGS", "{}"))
jq = JobQueue(os.environ.get("JK_E2E_DATABASE", "sqlite:///unused-results.db"), **SETTINGS)


@jq.task()
def echo(value: Any, seconds: float = 0.0) -> Any:
    time.sleep(seconds)
    return {"echo": value}


@jq.task(max_attempts=2, backoff=lambda attempt, error: 0.0)
def always_fails() -> None:
    raise RuntimeError("boom")


@jq.task(max_attempts=5, backoff=lambda attempt, error: 0.0)
def fails_then_succeeds(times: int) -> int:
    if current_job().attempt <= times:
        raise RuntimeError(f"attempt {current_job().attempt} fails")
    return current_job().attempt


@jq.task()
def snoozes_once(delay: float) -> int:
    job = current_job()
    if not os.path.exists(_marker(job.id)):
        with open(_marker(job.id), "w"):
            pass
        raise Snooze(delay)
    return job.attempt


def _marker(job_id: int) -> str:
    return os.path.join(os.environ.get("JK_RESULTS_TMP", "/tmp"), f"snoozed-{job_id}")
