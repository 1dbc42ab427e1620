"""The demo's count of the killed worker's jobs that the other workers then
finished: by the ids it held, whether or not a job carries a "worker lost"
error (a claimed job that had not started is handed back without one)."""

from __future__ import annotations

from datetime import UTC, datetime

from jobkeeper.demo.runner import finished_by_others
from jobkeeper.models import Job, JobStatus

NOW = datetime(2024, 1, 1, tzinfo=UTC)


def job(job_id: int, status: JobStatus, errors: list[dict[str, str]] | None = None) -> Job:
    return Job(
        id=job_id,
        task="count_file",
        args={},
        queue="demo",
        status=status,
        priority=0,
        attempt=1,
        max_attempts=3,
        scheduled_at=NOW,
        created_at=NOW,
        errors=errors or [],
    )


def test_held_jobs_finished_later_are_counted_with_or_without_an_error():
    found = {
        1: job(1, JobStatus.COMPLETED),  # claimed, not started: handed back, no error
        2: job(2, JobStatus.COMPLETED, [{"error": "worker lost (rescued)"}]),
        3: job(3, JobStatus.DEAD),
        4: job(4, JobStatus.AVAILABLE),  # not finished yet
        5: job(5, JobStatus.COMPLETED, [{"error": "worker lost (rescued)"}]),  # not held
    }
    assert finished_by_others([1, 2, 3, 4, 99], found) == 3
    assert finished_by_others([], found) == 0
