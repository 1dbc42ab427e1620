"""Waiting on a condition with a deadline, never for a fixed time: a test
goes on as soon as what it waits for is true, and fails with what it waited
for when it never becomes true.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from jobkeeper import Job, JobQueue, JobStatus

from .db import job

#: Longest any condition is waited for by default: far above what a passing
#: run needs, even with worker processes starting on a loaded machine.
DEADLINE = 60.0


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = DEADLINE,
    what: str = "condition",
    every: float = 0.02,
) -> Any:
    """Call ``predicate`` every ``every`` seconds until it returns something
    truthy, and return that; raise AssertionError after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def wait_status(
    jq: JobQueue, job_ids: Sequence[int], statuses: set[JobStatus], *, timeout: float = DEADLINE
) -> list[Job]:
    """Wait until every job is in one of ``statuses``; return them."""

    def check() -> list[Job] | None:
        jobs = [job(jq, i) for i in job_ids]
        return jobs if all(j.status in statuses for j in jobs) else None

    return wait_for(check, timeout=timeout, what=f"jobs {list(job_ids)} to reach {statuses}")
