"""C-06: exponential backoff overflows and the job vanishes
(procrastinate#1462).

The retry path is called directly for attempts 1, 16, 64, 1,000, 100,000 and
2**31 with large bases and no cap (or the largest one): the delay is finite,
non-negative, non-decreasing and capped, the retry decision never raises,
and the due time it leads to is stored and read back on both backends. A real
worker drives a job through many attempts (the attempt counter jumped
forward as a test hook for the clock), also with a task's own exponential
backoff that overflows a float: the job is always retryable or dead, never
gone.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import pytest

from backends.helpers import claim, fail, total_rows
from jobkeeper import JobQueue, JobStatus
from jobkeeper.backoff import ABSOLUTE_MAX_BACKOFF, backoff_ceiling, backoff_delay
from jobkeeper.config import Settings
from jobkeeper.models import FailureKind
from jobkeeper.outcomes import failed_attempt
from support.db import job, now_sql, sql
from worker.helpers import running_count

ATTEMPTS = [1, 16, 64, 1_000, 100_000, 2**31]
#: "No cap" and the largest caps a user can set.
CAPS = [math.inf, 1e300, ABSOLUTE_MAX_BACKOFF, 86_400.0]


def make_due(jq: JobQueue, job_id: int) -> None:
    """Test hook for the backoff clock: a retryable job is due now."""
    sql(
        jq,
        f"UPDATE jobkeeper_jobs SET scheduled_at = {now_sql(jq)} "
        "WHERE status = 'retryable' AND id = ?",
        [job_id],
    )


@pytest.mark.parametrize("base", [2, 5.0, 10.0, 1000.0])
@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("rand", [0.0, 0.5, 0.999999])
def test_c06_delay_is_finite_non_negative_non_decreasing_and_capped(base, cap, rand):
    delays = [
        backoff_delay(attempt, base=base, max_backoff=cap, rand=lambda: rand)
        for attempt in ATTEMPTS
    ]
    assert all(math.isfinite(d) and d >= 0.0 for d in delays), delays
    assert delays == sorted(delays)
    assert max(delays) <= min(cap, ABSOLUTE_MAX_BACKOFF)
    # Past attempt 64 every base reaches the cap (full jitter scales it).
    assert delays[-1] == rand * min(cap, ABSOLUTE_MAX_BACKOFF)


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_c06_retry_decision_and_its_due_time_are_storable(jq, attempt):
    """The product's retry decision for ``attempt`` (the job's counter
    cannot exceed max_attempts, 1,000,000: the decision is computed for a
    copy of the claimed job with that attempt), then the worst delay it can
    pick written for the real claimed job."""
    queued = jq.enqueue("t", {}, max_attempts=1_000_000)
    (held,) = claim(jq)
    settings = Settings(backoff_base=10.0, max_backoff=1e300)
    at_attempt = dataclasses.replace(held, attempt=attempt, max_attempts=2**31 + 1)
    decision = failed_attempt(at_attempt, settings, error="boom")
    assert decision.outcome == FailureKind.RETRYABLE
    ceiling = backoff_ceiling(attempt, base=10.0, max_backoff=1e300)
    assert 0.0 <= decision.retry_in <= ceiling <= ABSOLUTE_MAX_BACKOFF
    before = jq.backend.db_now()
    assert fail(jq, held, retry_in=ceiling) == {queued.id}
    stored = job(jq, queued.id)
    assert stored.status == JobStatus.RETRYABLE
    expected = before + timedelta(seconds=ceiling)
    assert abs(stored.scheduled_at - expected) < timedelta(seconds=30)
    if attempt >= 16:
        assert stored.scheduled_at.year >= datetime.now(UTC).year + 99
        assert jq.backend.job_stage_due().staged == 0
    assert jq.list_jobs(status="retryable")[0].id == queued.id
    # The last allowed attempt dead-letters, with the same decision path.
    last = dataclasses.replace(held, attempt=attempt, max_attempts=attempt)
    assert failed_attempt(last, settings, error="boom").outcome == FailureKind.DEAD


def test_c06_the_longest_backoff_is_stored_and_the_job_ends_dead(jq):
    job = jq.enqueue("t", {}, max_attempts=1_000_000)
    sql(jq, "UPDATE jobkeeper_jobs SET attempt = 999998 WHERE id = ?", (job.id,))
    (running,) = claim(jq)
    assert running.attempt == 999_999
    retry_in = backoff_delay(
        running.attempt, base=10.0, max_backoff=float("inf"), rand=lambda: 0.999999
    )
    assert 0 < retry_in <= ABSOLUTE_MAX_BACKOFF
    assert fail(jq, running, retry_in=retry_in) == {job.id}
    stored = jq.get_job(job.id)
    assert stored is not None
    assert stored.status == JobStatus.RETRYABLE
    expected = jq.backend.db_now() + timedelta(seconds=retry_in)
    assert abs(stored.scheduled_at - expected) < timedelta(seconds=5)
    assert stored.scheduled_at.year >= datetime.now(UTC).year + 99
    assert jq.backend.job_stage_due().staged == 0
    due_in = jq.backend.job_next_due_in(queues=["default"])
    assert due_in is not None and due_in > 99 * 365 * 86_400
    assert jq.stats()["default"]["retryable"] == 1
    # The last attempt goes to the dead letters; the job is still there.
    sql(
        jq,
        "UPDATE jobkeeper_jobs SET status = 'available', attempt = 999999 WHERE id = ?",
        (job.id,),
    )
    (last,) = claim(jq)
    assert last.attempt == last.max_attempts == 1_000_000
    assert fail(jq, last, "dead") == {job.id}
    dead = jq.get_job(job.id)
    assert dead is not None and dead.status == JobStatus.DEAD
    assert total_rows(jq) == 1


def test_c06_a_real_worker_drives_a_job_through_many_attempts_and_never_loses_it(make_queue):
    # base 10 with the largest cap: the delay reaches the absolute cap
    # (~100 years) after a few attempts and must stay finite and storable.
    jq = make_queue(backoff_base=10, max_backoff=1e300)

    @jq.task(max_attempts=1_000_000)
    def always_fails() -> None:
        raise RuntimeError("still failing")

    j = always_fails.enqueue()
    # Drive the job through attempts 1..6 for real, then jump the counter
    # (a test hook for "many attempts later") to 16, 64, 1000, 100000 and
    # the last one.
    previous_delay = 0.0
    attempt = 0
    for jump_to in [None] * 6 + [15, 63, 999, 99_999, 999_999]:
        if jump_to is not None:
            sql(jq, "UPDATE jobkeeper_jobs SET attempt = ? WHERE id = ?", [jump_to, j.id])
            attempt = jump_to
        make_due(jq, j.id)
        jq.run_worker(burst=True)
        now = job(jq, j.id)
        # At least one more attempt: a burst worker also runs the job again
        # when full jitter picks a delay under poll_interval (0.5% of the time
        # after attempt 1 with base 10, which made this test flaky).
        assert now.attempt >= attempt + 1
        attempt = expected_attempt = now.attempt
        if expected_attempt == 1_000_000:
            assert now.status == JobStatus.DEAD
            assert "max_attempts=1000000" in (now.dead_reason or "")
            break
        assert now.status == JobStatus.RETRYABLE, now
        assert now.finished_at is not None
        delay = (now.scheduled_at - now.finished_at).total_seconds()
        ceiling = backoff_ceiling(expected_attempt, base=10, max_backoff=1e300)
        assert math.isfinite(delay) and 0 <= delay <= ceiling + 1
        assert ceiling <= ABSOLUTE_MAX_BACKOFF
        assert now.scheduled_at - now.finished_at <= timedelta(seconds=ABSOLUTE_MAX_BACKOFF + 1)
        previous_delay = max(previous_delay, delay)
    else:
        raise AssertionError("the job never reached its last attempt")
    # At high attempts the ceiling is the absolute cap: the delays got large.
    assert previous_delay > 86_400
    assert running_count(jq) == 0


def test_c06_a_tasks_own_overflowing_backoff_falls_back_to_the_capped_default(make_queue):
    # procrastinate's shape: the user's exponential backoff overflows (10.0
    # ** 400 raises OverflowError) inside the retry decision.
    jq = make_queue(backoff_base=10, max_backoff=1e300)

    @jq.task(max_attempts=1_000_000, backoff=lambda attempt, error: 10.0**attempt)
    def fails() -> None:
        raise RuntimeError("still failing")

    @jq.task(max_attempts=1_000_000, backoff=lambda attempt, error: math.inf)
    def forever() -> None:
        raise RuntimeError("still failing")

    jobs = [fails.enqueue(), forever.enqueue()]
    for j in jobs:
        sql(jq, "UPDATE jobkeeper_jobs SET attempt = 999 WHERE id = ?", [j.id])
    assert jq.worker(burst=True).run().exit_code == 0
    for j in jobs:
        now = job(jq, j.id)
        assert now.status == JobStatus.RETRYABLE and now.attempt == 1_000, now
        assert now.finished_at is not None
        wait = (now.scheduled_at - now.finished_at).total_seconds()
        assert 0.0 <= wait <= ABSOLUTE_MAX_BACKOFF + 1
    assert running_count(jq) == 0
    assert total_rows(jq) == 2
