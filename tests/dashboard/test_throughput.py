"""The throughput read keeps closed buckets per process (both backends).
helper-65 measured the overview's read of every row finished in the last
hour at 650-850 ms with 660k rows in that hour, each load; under a 500 ms
statement_timeout the overview returned 503 now and then.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import pytest

from jobkeeper import JobQueue
from jobkeeper.backends import cockpit
from jobkeeper.errors import ConfigError

from .seed import finish, run_sql


def pin_now(jq: JobQueue, monkeypatch, at: float) -> None:
    """Make the backend's clock read ``at`` (Unix seconds)."""
    monkeypatch.setattr(jq.backend, "db_now", lambda: datetime.fromtimestamp(at, UTC))


def spy_reads(jq: JobQueue, monkeypatch) -> list[float]:
    """The start (Unix seconds) of each throughput read of ``jq``'s backend."""
    starts: list[float] = []
    real_fetch = jq.backend._fetch

    def fetch(name, params=None, **kwargs):
        if name == "job_throughput":
            since = params["from"]
            starts.append(since if isinstance(since, float) else since.timestamp())
        return real_fetch(name, params, **kwargs)

    monkeypatch.setattr(jq.backend, "_fetch", fetch)
    return starts


def completed(series: dict[float, dict[str, int]]) -> dict[float, int]:
    return {start: c["completed"] for start, c in series.items() if c.get("completed")}


def test_closed_buckets_are_read_once_and_kept(jq, monkeypatch):
    finish(jq, "q", 5, ago=600)
    finish(jq, "q", 3)
    now = jq.backend.db_now().timestamp() + 0.5
    pin_now(jq, monkeypatch, now)
    starts = spy_reads(jq, monkeypatch)
    first = jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    assert sum(completed(first).values()) == 8
    # The first read starts at the window's first whole bucket; the next at
    # the first bucket not yet settled.
    assert starts[0] == (math.floor((now - 3600) / 60) + 1) * 60
    cutoff = now - 300
    pruned = datetime.fromtimestamp(cutoff, UTC) if jq.backend.name == "postgresql" else cutoff
    query = "DELETE FROM jobkeeper_jobs WHERE finished_at < {}"
    run_sql(jq, query.format("%s"), query.format("?"), (pruned,))
    finish(jq, "q", 2)
    second = jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    assert starts[1] == math.floor((now - cockpit.THROUGHPUT_SETTLED) / 60) * 60
    # The closed bucket is kept (its rows pruned since); the open one re-read.
    assert sum(completed(second).values()) == 10
    assert {k: v for k, v in completed(second).items() if k < now - 300} == {
        k: v for k, v in completed(first).items() if k < now - 300
    }
    # A process of its own reads the whole window: the pruned rows are gone.
    other = JobQueue(jq.url.url)
    try:
        pin_now(other, monkeypatch, now)
        assert sum(completed(other.backend.job_throughput(
            since_seconds=3600, bucket_seconds=60)).values()) == 5  # fmt: skip
    finally:
        other.close()


def test_kept_buckets_add_up_to_a_full_read(jq, monkeypatch):
    for ago in (3500, 1800, 400, 150, 90, 30, 0):
        finish(jq, "q", 2, ago=ago)
    now = jq.backend.db_now().timestamp() + 0.5
    pin_now(jq, monkeypatch, now)
    jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    for ago in (1, 0):  # into the open bucket and, maybe, the one just closed
        finish(jq, "q", 4, ago=ago)
    kept = jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    other = JobQueue(jq.url.url)
    try:
        pin_now(other, monkeypatch, now)
        full = other.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    finally:
        other.close()
    assert kept == full and sum(completed(full).values()) == 22


def test_a_bucket_closed_less_than_the_margin_ago_is_not_kept(jq, monkeypatch):
    finish(jq, "q", 1)
    boundary = math.floor(jq.backend.db_now().timestamp() / 60) * 60
    pin_now(jq, monkeypatch, boundary + cockpit.THROUGHPUT_SETTLED - 0.5)
    jq.backend.job_throughput(since_seconds=600, bucket_seconds=60)
    kept = jq.backend._buckets().sizes[60]
    assert boundary / 60 - 2 in kept and boundary / 60 - 1 not in kept
    pin_now(jq, monkeypatch, boundary + cockpit.THROUGHPUT_SETTLED + 0.5)
    jq.backend.job_throughput(since_seconds=600, bucket_seconds=60)
    assert boundary / 60 - 1 in kept and boundary / 60 not in kept


def test_bucket_sizes_and_counts_kept_are_bounded(jq, monkeypatch):
    monkeypatch.setattr(cockpit, "THROUGHPUT_KEPT", 20)
    for size in (1.0, 2.0, 5.0, 10.0, 30.0):
        jq.backend.job_throughput(since_seconds=100 * size, bucket_seconds=size)
    sizes = jq.backend._buckets().sizes
    assert list(sizes) == [2.0, 5.0, 10.0, 30.0]
    assert all(len(kept) <= 20 for kept in sizes.values())
    # The newest are the ones kept.
    assert (
        max(sizes[30.0])
        == math.floor((jq.backend.db_now().timestamp() - cockpit.THROUGHPUT_SETTLED) / 30) - 1
    )


def test_a_finish_committed_late_is_counted_within_the_margin(jq, monkeypatch):
    # helper-66: worker acks held up 6 s by a lock committed after their
    # bucket had been kept (2 s margin then), and were never counted.
    now = jq.backend.db_now().timestamp() + 0.5
    pin_now(jq, monkeypatch, now)
    assert completed(jq.backend.job_throughput(since_seconds=600, bucket_seconds=10)) == {}
    finish(jq, "q", 4, ago=30)  # stamped 30 s back, committed only now
    series = jq.backend.job_throughput(since_seconds=600, bucket_seconds=10)
    assert sum(completed(series).values()) == 4


def test_a_caller_editing_its_answer_leaves_the_kept_counts(jq, monkeypatch):
    finish(jq, "q", 5, ago=120)
    first = jq.backend.job_throughput(since_seconds=600, bucket_seconds=60)
    for counts in first.values():
        if "completed" in counts:
            counts["total"] = counts.pop("completed")
    again = jq.backend.job_throughput(since_seconds=600, bucket_seconds=60)
    assert sum(completed(again).values()) == 5


def test_buckets_kept_from_a_clock_that_ran_ahead_are_read_again(jq, monkeypatch):
    # helper-66: a read while the database clock ran 300 s ahead kept the
    # buckets up to then as empty; jobs finished in them after the clock was
    # put back were never counted.
    now = jq.backend.db_now().timestamp()
    pin_now(jq, monkeypatch, now + 300)
    jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    finish(jq, "q", 7)
    # Those 7 are in a bucket settled by now + 120, and inside what was kept.
    pin_now(jq, monkeypatch, now + 120)
    series = jq.backend.job_throughput(since_seconds=600, bucket_seconds=60)
    assert sum(completed(series).values()) == 7


@pytest.mark.parametrize(
    ("since", "bucket"),
    [
        (1e12, 1e8),
        (1e300, 1e297),
        (1e-6, 1e-10),
        (5e-324, 5e-324),
        (0, 60),
        (60, 0),
        (60, 1e12),  # helper-68: a bucket past year 9999
        (0.5, 1),  # no whole bucket in the window: [] or one, by the moment
        (10.000001, 0.001),
    ],
)
def test_out_of_range_windows_are_refused_by_name(jq, since, bucket):
    # helper-66: ValueError/OverflowError from datetime, or bigint out of range.
    with pytest.raises(ConfigError, match=r"since|bucket"):
        jq.throughput(since, bucket)


def test_a_slow_clock_answer_is_not_a_step_back(jq, monkeypatch):
    # helper-68: one db_now answer slower than CLOCK_STEP was read as the
    # clock stepping back, and the next read read the whole window again.
    monkeypatch.setattr(cockpit, "CLOCK_STEP", 0.2)
    finish(jq, "q", 3, ago=600)
    jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    starts = spy_reads(jq, monkeypatch)
    real_now = jq.backend.db_now

    def slow_now():
        now = real_now()
        time.sleep(0.3)
        return now

    monkeypatch.setattr(jq.backend, "db_now", slow_now)
    jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    monkeypatch.setattr(jq.backend, "db_now", real_now)
    series = jq.backend.job_throughput(since_seconds=3600, bucket_seconds=60)
    assert sum(completed(series).values()) == 3
    settled = (jq.backend.db_now().timestamp() - cockpit.THROUGHPUT_SETTLED) // 60 * 60
    assert all(start >= settled - 60 for start in starts)  # no whole-window read


def test_every_bucket_of_the_window_is_returned_by_one_clock_reading(jq, monkeypatch):
    # The API filled the empty buckets from a second db_now: two round trips,
    # and two clock readings that could disagree on the current bucket.
    now = jq.backend.db_now().timestamp() + 0.5
    pin_now(jq, monkeypatch, now)
    series = jq.backend.job_throughput(since_seconds=600, bucket_seconds=60)
    current = math.floor(now / 60)
    assert list(series) == [n * 60 for n in range(math.floor((now - 600) / 60) + 1, current + 1)]
    calls = []
    monkeypatch.setattr(
        jq.backend, "db_now", lambda: calls.append(1) or datetime.fromtimestamp(now, UTC)
    )
    assert len(jq.throughput(600, 60)) == 10 and len(calls) == 1
