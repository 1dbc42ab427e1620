"""Inspecting and acting on jobs: get_job, list_jobs, stats, cancel, retry,
requeue_dead, on both backends.
"""

from __future__ import annotations

import pytest

from jobkeeper import ConfigError, JobNotFound, JobStateError, JobStatus
from support.db import count

from .helpers import claim, complete, fail, kill

ALL_STATUSES = {s.value for s in JobStatus}


# -- get_job -----------------------------------------------------------------------------


def test_get_job_finds_live_completed_and_dead_jobs(jq):
    live = jq.enqueue("t", {"n": 1})
    done = jq.enqueue("t", {"n": 2}, queue="other")
    dead = jq.enqueue("t", {"n": 3}, queue="third")

    (running,) = claim(jq, "other")
    assert complete(jq, running, '{"ok":true}') == {done.id}
    kill(jq, dead)

    got = jq.get_job(live.id)
    assert got is not None and got.status == JobStatus.AVAILABLE and got.args == {"n": 1}
    got = jq.get_job(done.id)
    assert got is not None
    assert got.status == JobStatus.COMPLETED
    assert got.result == {"ok": True}
    assert got.finished_at is not None and got.worker_id is None
    got = jq.get_job(dead.id)
    assert got is not None
    assert got.status == JobStatus.DEAD
    assert got.args == {"n": 3}
    assert got.attempt == 1
    assert got.dead_reason == "boom"
    assert [e["error"] for e in got.errors] == ["boom"]
    assert got.errors[0]["attempt"] == 1 and got.errors[0]["at"]


def test_get_job_unknown_is_none_and_bad_ids_are_refused(jq):
    assert jq.get_job(999_999) is None
    for bad in (0, -1, 2**63, "1", 1.0, True):
        with pytest.raises(ConfigError, match="job id"):
            jq.get_job(bad)


# -- list_jobs ---------------------------------------------------------------------------


def test_list_jobs_filters_by_status_and_queue_newest_first(jq):
    a1 = jq.enqueue("t", {}, queue="a")
    a2 = jq.enqueue("t", {}, queue="a")
    b1 = jq.enqueue("t", {}, queue="b", delay=3600)
    b2 = jq.enqueue("t", {}, queue="b")
    kill(jq, b2)

    ids = lambda jobs: [j.id for j in jobs]  # noqa: E731
    assert ids(jq.list_jobs()) == [b2.id, b1.id, a2.id, a1.id]
    assert ids(jq.list_jobs(queue="a")) == [a2.id, a1.id]
    assert ids(jq.list_jobs(status="available")) == [a2.id, a1.id]
    assert ids(jq.list_jobs(status=JobStatus.SCHEDULED)) == [b1.id]
    assert ids(jq.list_jobs(status="dead")) == [b2.id]
    assert ids(jq.list_jobs(status="dead", queue="a")) == []
    assert ids(jq.list_jobs(queue="b")) == [b2.id, b1.id]
    assert ids(jq.list_jobs(limit=2)) == [b2.id, b1.id]
    assert ids(jq.list_jobs(status="running")) == []
    assert ids(jq.list_jobs(queue="nobody")) == []
    assert all(j.status == JobStatus.DEAD for j in jq.list_jobs(status="dead"))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"status": "finished"}, "unknown status 'finished'"),
        ({"status": "DEAD"}, "unknown status"),
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "5"}, "limit"),
        ({"queue": "bad queue"}, "queue name"),
    ],
)
def test_list_jobs_bad_filters(jq, kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        jq.list_jobs(**kwargs)


# -- stats -------------------------------------------------------------------------------


def test_stats_has_every_status_for_each_queue_with_zeros(jq):
    assert jq.stats() == {}
    jq.enqueue("t", {}, queue="a")
    jq.enqueue("t", {}, queue="a", delay=3600)
    jq.enqueue("t", {}, queue="b")
    dead = jq.enqueue("t", {}, queue="c")
    kill(jq, dead)
    cancelled = jq.enqueue("t", {}, queue="b", delay=60)
    jq.cancel(cancelled.id)
    stats = jq.stats()
    assert sorted(stats) == ["a", "b", "c"]
    for per_status in stats.values():
        assert set(per_status) == ALL_STATUSES
    assert stats["a"] == {**dict.fromkeys(ALL_STATUSES, 0), "available": 1, "scheduled": 1}
    assert stats["b"] == {**dict.fromkeys(ALL_STATUSES, 0), "available": 1, "cancelled": 1}
    assert stats["c"] == {**dict.fromkeys(ALL_STATUSES, 0), "dead": 1}


# -- cancel ------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [None, 3600])
def test_cancel_pending_job(jq, delay):
    job = jq.enqueue("t", {}, delay=delay)
    cancelled = jq.cancel(job.id)
    assert cancelled.status == JobStatus.CANCELLED
    assert cancelled.finished_at is not None
    stored = jq.get_job(job.id)
    assert stored is not None and stored.status == JobStatus.CANCELLED
    assert claim(jq) == []
    assert jq.backend.job_stage_due().staged == 0
    # Cancelling again is harmless.
    assert jq.cancel(job.id).status == JobStatus.CANCELLED


def test_cancel_retryable_job(jq):
    job = jq.enqueue("t", {})
    (running,) = claim(jq)
    fail(jq, running, retry_in=3600)
    assert jq.cancel(job.id).status == JobStatus.CANCELLED


def test_cancel_running_job_asks_its_worker(jq):
    job = jq.enqueue("t", {})
    (running,) = claim(jq)
    after = jq.cancel(job.id)
    assert after.status == JobStatus.CLAIMED
    assert after.cancel_requested is True
    assert after.worker_id == running.worker_id
    requested = jq.backend.job_cancel_requested(worker_id=running.worker_id or "")
    assert [c.job_id for c in requested] == [job.id]
    # The worker's fenced write still works and ends the job.
    assert fail(jq, running, "cancelled") == {job.id}
    final = jq.get_job(job.id)
    assert final is not None and final.status == JobStatus.CANCELLED


def test_cancel_finished_or_unknown(jq):
    done = jq.enqueue("t", {})
    (running,) = claim(jq)
    complete(jq, running)
    with pytest.raises(JobStateError, match="completed"):
        jq.cancel(done.id)
    dead = kill(jq, jq.enqueue("t", {}))
    with pytest.raises(JobStateError, match="dead"):
        jq.cancel(dead.id)
    with pytest.raises(JobNotFound):
        jq.cancel(987_654)
    after = jq.get_job(done.id)
    assert after is not None and after.status == JobStatus.COMPLETED


# -- retry and requeue -------------------------------------------------------------------


def assert_fresh(jq, job_id, errors):
    job = jq.get_job(job_id)
    assert job is not None
    assert job.status == JobStatus.AVAILABLE
    assert job.attempt == 0
    assert job.finished_at is None
    assert job.worker_id is None
    assert [e["error"] for e in job.errors] == errors
    return job


def test_retry_dead_job_moves_it_back_with_errors_kept(jq):
    job = jq.enqueue("t", {"keep": "me"})
    kill(jq, job)
    retried = jq.retry(job.id)
    assert retried.status == JobStatus.AVAILABLE
    assert_fresh(jq, job.id, ["boom"])
    assert count(jq, "jobkeeper_dead_letters") == 0
    assert count(jq) == 1
    (again,) = claim(jq)
    assert again.id == job.id and again.attempt == 1 and again.args == {"keep": "me"}


def test_retry_retryable_cancelled_and_completed_jobs(jq):
    retryable = jq.enqueue("t", {}, queue="r")
    (running,) = claim(jq, "r")
    fail(jq, running, retry_in=3600, error="first")
    cancelled = jq.enqueue("t", {}, queue="c")
    jq.cancel(cancelled.id)
    completed = jq.enqueue("t", {}, queue="d")
    (running,) = claim(jq, "d")
    complete(jq, running)

    assert jq.retry(retryable.id).status == JobStatus.AVAILABLE
    assert_fresh(jq, retryable.id, ["first"])
    assert jq.retry(cancelled.id).status == JobStatus.AVAILABLE
    assert not assert_fresh(jq, cancelled.id, []).cancel_requested
    assert jq.retry(completed.id).status == JobStatus.AVAILABLE
    assert_fresh(jq, completed.id, [])
    assert [j.id for j in claim(jq, "r")] == [retryable.id]


@pytest.mark.parametrize("delay", [None, 60])
def test_retry_pending_job_is_refused(jq, delay):
    job = jq.enqueue("t", {}, delay=delay)
    with pytest.raises(JobStateError, match="only dead, retryable, cancelled or completed"):
        jq.retry(job.id)
    (running,) = claim(jq) or [None]
    if running is not None:
        with pytest.raises(JobStateError, match="claimed"):
            jq.retry(job.id)
        after = jq.get_job(job.id)
        assert after is not None and after.status == JobStatus.CLAIMED and after.attempt == 1


def test_retry_if_status_refuses_a_job_that_moved_on(jq):
    # What a dashboard page showed: retryable. The job has completed since.
    job = jq.enqueue("t", {}, queue="r")
    (running,) = claim(jq, "r")
    fail(jq, running, retry_in=0, error="first")
    jq.retry(job.id)
    (running,) = claim(jq, "r")
    complete(jq, running)
    before = jq.get_job(job.id)
    with pytest.raises(JobStateError, match=f"job {job.id} is completed now, not retryable"):
        jq.retry(job.id, if_status="retryable")
    assert jq.get_job(job.id) == before
    # The backend's check is the statement's own: a status that changed
    # after the API read it is refused there too.
    assert jq.backend.job_retry(job_id=job.id, statuses=["retryable"]) is None
    assert jq.get_job(job.id) == before
    # Completed again after another run: the same status, not the same job.
    seen = jq.get_job(job.id)
    jq.retry(job.id)
    (running,) = claim(jq, "r")
    complete(jq, running)
    again = jq.get_job(job.id)
    assert again.status == seen.status and again.fence != seen.fence
    with pytest.raises(JobStateError, match=f"job {job.id} is completed at fence .*: it ran again"):
        jq.retry(job.id, if_status="completed", if_fence=seen.fence)
    assert jq.backend.job_retry(job_id=job.id, statuses=["completed"], fence=seen.fence) is None
    assert jq.get_job(job.id) == again
    # The status and fence it is at: retried.
    retried = jq.retry(job.id, if_status=JobStatus.COMPLETED, if_fence=again.fence)
    assert retried.status == JobStatus.AVAILABLE
    # A dead letter, only as one.
    dead = jq.enqueue("t", {}, queue="d")
    kill(jq, dead)
    with pytest.raises(JobStateError, match="is dead now, not cancelled"):
        jq.retry(dead.id, if_status="cancelled")
    assert jq.backend.job_retry(job_id=dead.id, statuses=["retryable"]) is None
    assert jq.retry(dead.id, if_status="dead").status == JobStatus.AVAILABLE
    with pytest.raises(ConfigError, match="if_status must be a job status"):
        jq.retry(dead.id, if_status="finished")


def test_retry_unknown_job(jq):
    with pytest.raises(JobNotFound):
        jq.retry(424_242)


def test_requeue_dead_by_id_and_all(jq):
    jobs = [jq.enqueue("t", {"n": n}, queue=f"q{n}") for n in range(4)]
    for job in jobs:
        kill(jq, job)
    live = jq.enqueue("t", {})
    assert count(jq, "jobkeeper_dead_letters") == 4
    assert jq.requeue_dead([]) == []  # an empty list is not "all"
    assert count(jq, "jobkeeper_dead_letters") == 4

    assert jq.requeue_dead([jobs[1].id, live.id, 777_777]) == [jobs[1].id]
    assert_fresh(jq, jobs[1].id, ["boom"])
    assert count(jq, "jobkeeper_dead_letters") == 3

    assert jq.requeue_dead() == sorted([jobs[0].id, jobs[2].id, jobs[3].id])
    for job in jobs:
        assert_fresh(jq, job.id, ["boom"])
    assert count(jq, "jobkeeper_dead_letters") == 0
    assert count(jq) == 5
    assert jq.requeue_dead() == []
