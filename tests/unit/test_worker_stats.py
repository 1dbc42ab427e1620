"""A worker's tally (WorkerStats): what its stop line and drain() report."""

from __future__ import annotations

import logging

import pytest

from jobkeeper import joblog
from jobkeeper.models import Claim, Completion, Failure, FailureKind
from jobkeeper.worker.stats import WorkerStats


def _claim(job_id: int) -> Claim:
    return Claim(job_id=job_id, worker_id="w", attempt=1, fence=1)


def test_each_outcome_is_counted_under_its_own_name(caplog: pytest.LogCaptureFixture) -> None:
    # Break-test 4: the stop line counted snoozed and cancelled attempts as
    # "failed", and by_outcome (drain()'s answer) mixed str and FailureKind keys.
    kinds = [
        FailureKind.RETRYABLE, FailureKind.DEAD, FailureKind.SNOOZED, "snoozed",
        FailureKind.CANCELLED, FailureKind.RELEASED, FailureKind.RETURNED,
    ]  # fmt: skip
    batch = [Completion(_claim(1), None)] + [
        Failure(_claim(i), kind, None) for i, kind in enumerate(kinds, start=2)
    ]
    stats = WorkerStats()
    stats.count_written(batch, written={claim.claim.job_id for claim in batch} - {8})
    assert (stats.completed, stats.failed, stats.snoozed, stats.cancelled) == (1, 2, 2, 1)
    assert (stats.released, stats.lost_claims) == (1, 1)  # job 8 (returned) was refused
    assert stats.by_outcome == {
        "completed": 1, "retryable": 1, "dead": 1, "snoozed": 2, "cancelled": 1, "released": 1,
    }  # fmt: skip
    assert all(type(key) is str for key in stats.by_outcome)

    with caplog.at_level(logging.INFO, logger="jobkeeper.worker"):
        joblog.log_stop(worker_id="w", started=True, tally=stats, left_held=0)
    assert "1 completed, 2 failed, 2 snoozed, 1 cancelled, 1 handed back" in caplog.text
