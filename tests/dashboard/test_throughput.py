"""The throughput read keeps closed buckets per process (both backends).
helper-65 measured the overview's read of every row finished in the last
hour at 650-850 ms with 660k rows in that hour, each load; under a 500 ms
statement_timeout the overview returned 503 now and then.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from jobkeeper import JobQueue
from jobkeeper.backends import cockpit

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
