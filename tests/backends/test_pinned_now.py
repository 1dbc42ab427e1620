"""The time-dependent operations with a pinned ``now``: staging, rescue
candidates, pruning and leadership are judged by the caller's clock when it
gives one, so these tests move time instead of waiting for it.
"""

from __future__ import annotations

from datetime import timedelta

from jobkeeper import JobStatus

from .helpers import WORKER, claim, complete, count

HOUR = timedelta(hours=1)


def test_staging_moves_a_job_once_the_pinned_time_passes_its_due_time(jq):
    job = jq.enqueue("t", {}, delay=3600)
    now = jq.backend.db_now()

    early = jq.backend.job_stage_due(queues=["default"], now=now)
    assert early.staged == 0
    assert early.next_due_in is not None and 3500 < early.next_due_in < 3601
    assert jq.backend.job_next_due_in(queues=["default"], now=now + 2 * HOUR) < 0
    assert jq.get_job(job.id).status == JobStatus.SCHEDULED

    late = jq.backend.job_stage_due(queues=["default"], now=now + 2 * HOUR)
    assert late.staged == 1
    assert jq.get_job(job.id).status == JobStatus.AVAILABLE


def test_a_holder_becomes_a_rescue_candidate_once_the_pinned_time_passes_its_window(jq):
    jq.enqueue("t", {})
    (held,) = claim(jq)
    now = jq.backend.db_now()

    assert jq.backend.job_rescue_candidates(rescue_after=60, limit=10, now=now) == []
    later = now + timedelta(seconds=120)
    candidates = jq.backend.job_rescue_candidates(rescue_after=60, limit=10, now=later)
    assert [job.id for job in candidates] == [held.id]


def test_finished_jobs_are_pruned_once_the_pinned_time_passes_retention(jq):
    jq.enqueue("t", {})
    (held,) = claim(jq)
    assert complete(jq, held) == {held.id}
    now = jq.backend.db_now()

    assert jq.backend.job_prune_finished(older_than=3600, limit=10, now=now) == 0
    assert jq.backend.job_prune_finished(older_than=3600, limit=10, now=now + 2 * HOUR) == 1
    assert count(jq) == 0


def test_silent_workers_are_pruned_once_the_pinned_time_passes_their_window(jq):
    claim(jq)  # registers the worker, heartbeat now
    now = jq.backend.db_now()

    assert jq.backend.worker_prune_stale(older_than=3600, now=now) == 0
    assert jq.backend.worker_prune_stale(older_than=3600, now=now + 2 * HOUR) == 1
    assert [w.id for w in jq.backend.worker_list()] == []


def test_a_lease_expires_by_the_pinned_time(jq):
    now = jq.backend.db_now()
    backend = jq.backend
    assert backend.leader_try_acquire(name="lead", worker_id=WORKER, ttl=60, now=now)
    assert not backend.leader_try_acquire(name="lead", worker_id="other", ttl=60, now=now)
    later = now + timedelta(seconds=120)
    assert backend.leader_try_acquire(name="lead", worker_id="other", ttl=60, now=later)
