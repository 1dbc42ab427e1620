"""jobkeeper's exceptions survive pickling (Django's parallel test runner and
process pools send a test's or a task's exception to another process): each
comes back with its own arguments, its message and its attributes.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pytest

from jobkeeper import (
    ClaimLost,
    ConfigError,
    DatabaseError,
    DatabaseUnavailable,
    Discard,
    JobCancelled,
    JobFailed,
    PayloadError,
    QueueFull,
    Retry,
    Snooze,
)
from jobkeeper.models import Job, JobStatus


def _job() -> Job:
    now = datetime.now(UTC)
    return Job(
        id=5, task="t", args={"a": 1}, queue="q", status=JobStatus.DEAD, priority=0,
        attempt=1, max_attempts=1, scheduled_at=now, created_at=now,
        errors=[{"attempt": 1, "error": "boom"}],
    )  # fmt: skip


@pytest.mark.parametrize(
    "error",
    [
        Retry(3.5, "later"),
        Retry(),
        Snooze(2),
        Discard("no"),
        QueueFull("mail", 10, 12, adding=5),
        ClaimLost(7, 2, 9),
        ConfigError("bad"),
        PayloadError("worse"),
        DatabaseError("lost a race", retry_asked=True),
        DatabaseUnavailable("statement timeout", unreachable=False),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_exception_comes_back_from_pickle_as_it_was(error: Exception) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)


def test_wait_errors_keep_their_job() -> None:
    job = _job()
    for error in (JobFailed(job), JobCancelled(job)):
        again = pickle.loads(pickle.dumps(error))
        assert str(again) == str(error) and again.job == job
