"""complete_in and idempotency keys at the backend seam and outside a worker."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import UTC, datetime

import pytest

from jobkeeper import JobQueue, complete_in
from jobkeeper.models import Job, JobStatus
from jobkeeper.worker.sideeffects import idempotency_key


def test_each_database_draws_its_own_installation_value(make_queue, tmp_path):
    first = make_queue().backend.installation_get()
    other = JobQueue(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        other.migrate()
        second = other.backend.installation_get()
        other.migrate()  # idempotent: the value is kept
        assert other.backend.installation_get() == second
    finally:
        other.close()
    assert len(first) == len(second) == 32 and first != second


def test_key_is_fixed_by_the_job_not_its_attempt():
    created = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    job = Job(1, "t", {}, "q", JobStatus.RUNNING, 0, 1, 5, created, created, fence=1)
    retried = Job(1, "t", {}, "q", JobStatus.RUNNING, 0, 3, 5, created, created, fence=7)
    key = idempotency_key("ab" * 16, job)
    assert key == idempotency_key("ab" * 16, retried)
    assert key == f"jk-{'ab' * 16}-1-1767323045678901"
    assert key != idempotency_key("cd" * 16, job)
    later = Job(1, "t", {}, "q", JobStatus.RUNNING, 0, 1, 5, created, created.replace(second=6))
    assert key != idempotency_key("ab" * 16, later)


def test_complete_in_outside_a_task_is_refused():
    # Closed by the test: Python 3.13 warns (an error here) for an unclosed one.
    with (
        contextlib.closing(sqlite3.connect(":memory:")) as conn,
        pytest.raises(LookupError, match="complete_in"),
    ):
        complete_in(conn)
