"""The Jobs an insert returns, built from its input without a row to decode,
and the fast constructors they are built with."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from jobkeeper.backends.postgres.claimrows import claimed_job
from jobkeeper.backends.rows import job_from_new, job_from_row
from jobkeeper.frozen import frozen_builder
from jobkeeper.models import Job, JobStatus, NewJob

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def keyword_job(new: NewJob, job_id: int, status: JobStatus, scheduled_at: datetime) -> Job:
    """The same job through Job's own constructor."""
    return Job(
        id=job_id,
        task=new.task,
        args=new.args,
        queue=new.queue,
        status=status,
        priority=new.priority,
        attempt=0,
        max_attempts=new.max_attempts,
        scheduled_at=scheduled_at,
        created_at=NOW,
        unique_key=new.unique_key,
        serial_key=new.serial_key,
        trace_context=new.trace_context,
    )


@pytest.mark.parametrize(
    ("options", "status", "scheduled_at"),
    [
        ({}, JobStatus.AVAILABLE, NOW),
        ({"delay": 30.0}, JobStatus.SCHEDULED, NOW + timedelta(seconds=30)),
        ({"run_at": NOW + timedelta(hours=1)}, JobStatus.SCHEDULED, NOW + timedelta(hours=1)),
        ({"run_at": NOW - timedelta(hours=1)}, JobStatus.AVAILABLE, NOW - timedelta(hours=1)),
        (
            {"unique_key": "u", "serial_key": "s", "trace_context": '{"traceparent":"x"}'},
            JobStatus.AVAILABLE,
            NOW,
        ),
    ],
)
def test_a_new_job_equals_one_made_by_the_constructor(options, status, scheduled_at):
    new = NewJob(
        task="t", args_json='{"a":1}', args={"a": 1}, queue="q", priority=3, max_attempts=7,
        **options,
    )  # fmt: skip
    built = job_from_new(new, 42, NOW)
    # Equality reads every field: one the builder left unset would raise.
    assert built == keyword_job(new, 42, status, scheduled_at)
    assert type(built) is Job
    for field in dataclasses.fields(Job):
        getattr(built, field.name)


def test_each_new_job_gets_its_own_errors_list():
    new = NewJob(task="t", args_json="{}", args={}, queue="q", priority=0, max_attempts=1)
    first, second = job_from_new(new, 1, NOW), job_from_new(new, 2, NOW)
    assert first.errors == [] and first.errors is not second.errors


def test_args_are_decoded_when_the_input_has_only_their_text():
    new = NewJob(task="t", args_json='{"a":[1,2]}', queue="q", priority=0, max_attempts=1)
    assert job_from_new(new, 1, NOW).args == {"a": [1, 2]}


def test_a_new_job_stays_frozen():
    new = NewJob(task="t", args_json="{}", args={}, queue="q", priority=0, max_attempts=1)
    job = job_from_new(new, 1, NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.status = JobStatus.RUNNING  # type: ignore[misc]


def test_a_plain_new_job_equals_one_made_by_the_constructor():
    from jobkeeper.api.enqueue import _plain_new_job

    built = _plain_new_job("t", '{"a":1}', {"a": 1}, "q", 2, 9)
    assert built == NewJob(
        task="t", args_json='{"a":1}', args={"a": 1}, queue="q", priority=2, max_attempts=9
    )


def test_a_builder_refuses_to_leave_a_required_field_unset_or_name_a_missing_one():
    with pytest.raises(TypeError, match=r"Job\.id has no default"):
        frozen_builder(Job, ("task",))
    with pytest.raises(TypeError, match="no field 'nope'"):
        frozen_builder(NewJob, ("task", "args_json", "queue", "priority", "max_attempts", "nope"))


def test_a_claimed_row_equals_the_job_the_constructor_makes():
    naive = NOW.replace(tzinfo=None)
    row = (7, "q", "t", '{"a": 1}', 2, 3, 5, naive, naive, naive, "u", '[{"attempt": 1}]', 4, 1,
           '{"traceparent": "x"}', True)  # fmt: skip
    built = claimed_job(row, "w1", {})
    assert built == Job(
        id=7, task="t", args={"a": 1}, queue="q", status=JobStatus.CLAIMED, priority=2,
        attempt=3, max_attempts=5, scheduled_at=NOW, created_at=NOW, attempted_at=NOW,
        worker_id="w1", unique_key="u", errors=[{"attempt": 1}], fence=4, unstarted_returns=1,
        trace_context='{"traceparent": "x"}', run_alone=True,
    )  # fmt: skip
    assert type(built) is Job


def test_a_stored_row_equals_the_job_the_constructor_makes():
    row = {
        "id": 9, "task": "t", "args": '{"b": 2}', "queue": "q", "status": "running",
        "priority": 1, "attempt": 2, "max_attempts": 4, "scheduled_at": NOW, "created_at": NOW,
        "attempted_at": NOW, "finished_at": None, "worker_id": "w", "unique_key": None,
        "errors": "[]", "result": None, "cancel_requested": 1, "fence": 3,
        "unstarted_returns": 0, "serial_key": "s", "trace_context": None, "run_alone": 0,
        "crashes": 1, "alone_fence": 2,
    }  # fmt: skip
    built = job_from_row(row, lambda value: value)
    assert built == Job(
        id=9, task="t", args={"b": 2}, queue="q", status=JobStatus.RUNNING, priority=1,
        attempt=2, max_attempts=4, scheduled_at=NOW, created_at=NOW, attempted_at=NOW,
        worker_id="w", cancel_requested=True, fence=3, serial_key="s", crashes=1, alone_fence=2,
    )  # fmt: skip
    assert type(built) is Job
