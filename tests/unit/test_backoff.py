"""Retry backoff: exponential, capped, full jitter, never overflowing."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobkeeper.backoff import (
    ABSOLUTE_MAX_BACKOFF,
    DEFAULT_BASE,
    DEFAULT_MAX_BACKOFF,
    backoff_ceiling,
    backoff_delay,
)
from jobkeeper.outcomes import failed_attempt

C06_ATTEMPTS = [1, 16, 64, 1_000, 100_000, 2**31, 10**18]

attempts = st.sampled_from(C06_ATTEMPTS) | st.integers(min_value=1, max_value=10**18)
bases = st.floats(min_value=1.0, max_value=100.0, exclude_min=True) | st.sampled_from(
    [2, 5, 10, 100, 1.0000001]
)
#: Any cap at all: negative, zero, tiny, huge, infinite, NaN.
caps = st.floats() | st.sampled_from([0.0, 86_400.0, 1e300, math.inf])
unit_floats = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


def effective_cap(cap: float) -> float:
    if math.isnan(cap):
        return ABSOLUTE_MAX_BACKOFF
    return min(max(cap, 0.0), ABSOLUTE_MAX_BACKOFF)


@given(attempts, bases, caps, unit_floats)
@example(10**18, 10.0, math.inf, 0.999)
@example(2**31, 100.0, math.nan, 0.5)
@example(10**18, 2, math.nan, 0.5)  # an int base and a NaN cap once computed 2 ** 10**18
@example(9, 5.0, 1953124.9999999998, 0.999)  # rounding at the cap
@example(28, 1.1, 14.420993610649955, 0.999)
def test_delay_is_finite_non_negative_and_capped(attempt, base, cap, r):
    ceiling = backoff_ceiling(attempt, base=base, max_backoff=cap)
    delay = backoff_delay(attempt, base=base, max_backoff=cap, rand=lambda: r)
    assert math.isfinite(ceiling)
    assert math.isfinite(delay)
    assert 0.0 <= delay <= ceiling <= effective_cap(cap)
    assert ceiling <= ABSOLUTE_MAX_BACKOFF
    # The resulting due time is representable (and storable: PostgreSQL and
    # SQLite both hold years up to 9999).
    due = datetime(2100, 1, 1, tzinfo=UTC) + timedelta(seconds=ceiling)
    assert due.year < 9999


@given(st.lists(attempts, min_size=2, max_size=6), bases, caps)
@example([8, 9, 10], 5.0, 1953124.9999999998)
@example([27, 28, 29], 1.1, 14.420993610649955)
@example([1, 16, 64, 1_000, 100_000, 2**31, 10**18], 10.0, math.inf)
def test_ceiling_is_non_decreasing_in_attempt(attempt_list, base, cap):
    ceilings = [backoff_ceiling(a, base=base, max_backoff=cap) for a in sorted(attempt_list)]
    assert ceilings == sorted(ceilings)


@pytest.mark.parametrize("attempt", C06_ATTEMPTS)
@pytest.mark.parametrize("base", [5.0, 10.0, 100.0])
def test_large_base_no_cap_never_raises(attempt, base):
    ceiling = backoff_ceiling(attempt, base=base, max_backoff=math.inf)
    assert ceiling <= ABSOLUTE_MAX_BACKOFF
    if base ** min(attempt, 4) > ABSOLUTE_MAX_BACKOFF or attempt >= 16:
        assert ceiling == ABSOLUTE_MAX_BACKOFF


def test_exponential_then_capped_values():
    assert backoff_ceiling(1, base=2.0, max_backoff=86_400.0) == 2.0
    assert backoff_ceiling(3, base=2.0, max_backoff=86_400.0) == 8.0
    assert backoff_ceiling(16, base=2.0, max_backoff=86_400.0) == 65_536.0
    assert backoff_ceiling(17, base=2.0, max_backoff=86_400.0) == 86_400.0
    assert backoff_ceiling(3, base=10.0, max_backoff=86_400.0) == 1_000.0
    assert backoff_ceiling(1, base=2.0, max_backoff=0.05) == 0.05
    assert backoff_ceiling(5, base=2.0, max_backoff=0.0) == 0.0
    assert backoff_ceiling(5, base=2.0, max_backoff=-1.0) == 0.0
    assert backoff_ceiling(5) == min(DEFAULT_BASE**5, DEFAULT_MAX_BACKOFF)


@pytest.mark.parametrize("attempt", [0, -1, -(10**18)])
def test_attempts_below_one_count_as_one(attempt):
    assert backoff_ceiling(attempt, base=3.0, max_backoff=100.0) == 3.0


def test_full_jitter_scales_the_rand_source():
    assert backoff_delay(4, base=2.0, max_backoff=100.0, rand=lambda: 0.0) == 0.0
    assert backoff_delay(4, base=2.0, max_backoff=100.0, rand=lambda: 0.5) == 8.0
    assert backoff_delay(4, base=2.0, max_backoff=100.0, rand=lambda: 0.25) == 4.0
    assert backoff_delay(40, base=2.0, max_backoff=100.0, rand=lambda: 0.5) == 50.0


def test_full_jitter_is_reproducible_with_a_seeded_source_and_spreads_over_the_range():
    first = [backoff_delay(5, rand=random.Random(7).random) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    rng = random.Random(12345)
    delays = [backoff_delay(5, base=2.0, max_backoff=100.0, rand=rng.random) for _ in range(2000)]
    assert all(0.0 <= d <= 32.0 for d in delays)
    assert min(delays) < 1.0
    assert max(delays) > 31.0
    assert len(set(delays)) > 1900  # jittered, not a constant


def test_default_rand_is_the_random_module():
    random.seed(99)
    expected = random.random() * 32.0
    random.seed(99)
    assert backoff_delay(5, base=2.0, max_backoff=100.0) == expected


@pytest.mark.parametrize("attempt", C06_ATTEMPTS)
def test_retry_decision_never_raises_at_high_attempts(attempt):
    """The retry path itself (procrastinate#1462 lost the job when it raised)."""
    from jobkeeper.config import Settings
    from jobkeeper.models import Job, JobStatus

    now = datetime(2024, 1, 1, tzinfo=UTC)
    job = Job(
        id=1,
        task="t",
        args={},
        queue="default",
        status=JobStatus.RUNNING,
        priority=0,
        attempt=min(attempt, 2**31 - 1),
        max_attempts=1_000_000,
        scheduled_at=now,
        created_at=now,
        worker_id="w",
    )
    settings = Settings(backoff_base=10.0, max_backoff=ABSOLUTE_MAX_BACKOFF)
    failure = failed_attempt(job, settings, error="boom")
    expected = "dead" if job.attempt >= job.max_attempts else "retryable"
    assert failure.outcome == expected
    assert 0.0 <= failure.retry_in <= ABSOLUTE_MAX_BACKOFF
