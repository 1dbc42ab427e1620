"""Claimed jobs and cancel requests at the backend seam (rows fabricated, as River's
testfactory does): the claim counter (fence) refuses a stale holder's writes
even at the same attempt; start marks; a held job with a cancel request ends
cancelled whatever its attempt does next, unless it succeeds.
"""

from __future__ import annotations

import pytest

from jobkeeper import JobStatus
from jobkeeper.models import Failure
from jobkeeper.outcomes import error_entry
from support.db import count

from .helpers import WORKER, claim, claim_of, complete, fail


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {status: n for status, n in counts.items() if n}


@pytest.mark.parametrize("reclaimer", [WORKER, "other-worker"])
@pytest.mark.parametrize("hand_back", ["released", "returned"])
def test_a_stale_claim_at_the_same_attempt_writes_nothing(jq, reclaimer, hand_back):
    # A claim handed back unstarted (by its holder, or by the rescuer's free
    # return) gives its attempt back; the next claim runs the same attempt
    # number. Only the fence tells the two claims apart, even for the same
    # worker id.
    job = jq.enqueue("t", {})
    (stale,) = claim(jq)
    assert (stale.status, stale.attempt, stale.fence) == (JobStatus.CLAIMED, 1, 1)
    assert fail(jq, stale, hand_back) == {job.id}
    (current,) = claim(jq, worker_id=reclaimer)
    assert (current.attempt, current.fence, current.worker_id) == (1, 2, reclaimer)
    if reclaimer == WORKER:
        same = (stale.id, stale.worker_id, stale.attempt)
        assert same == (current.id, current.worker_id, current.attempt)
    # Nothing the stale holder writes lands: start mark, completion, failures.
    assert jq.backend.job_start_many(claims=[claim_of(stale)]) == set()
    assert complete(jq, stale, '"stale"') == set()
    for outcome in ("retryable", "dead", "cancelled", "released", "returned"):
        assert fail(jq, stale, outcome) == set()
    still = jq.get_job(job.id)
    assert still is not None
    assert (still.status, still.worker_id, still.fence) == (JobStatus.CLAIMED, reclaimer, 2)
    assert count(jq, "jobkeeper_dead_letters") == 0
    # The current holder's writes do.
    assert jq.backend.job_start_many(claims=[claim_of(current)]) == {job.id}
    started = jq.get_job(job.id)
    assert started is not None and started.status == JobStatus.RUNNING
    assert complete(jq, current, '"current"') == {job.id}
    done = jq.get_job(job.id)
    assert done is not None and (done.status, done.result) == (JobStatus.COMPLETED, "current")


def test_start_marks_move_claimed_to_running_fenced(jq):
    jobs = jq.enqueue_many([("t", {"i": i}) for i in range(3)])
    held = claim(jq)
    assert [j.status for j in held] == [JobStatus.CLAIMED] * 3
    assert nonzero(jq.stats()["default"]) == {"claimed": 3}
    assert jq.backend.job_start_many(claims=[claim_of(held[0])]) == {jobs[0].id}
    # A second mark, or one for a job already finished, changes nothing.
    assert jq.backend.job_start_many(claims=[claim_of(held[0])]) == set()
    assert complete(jq, held[1]) == {jobs[1].id}  # claimed -> completed directly
    assert jq.backend.job_start_many(claims=[claim_of(held[1])]) == set()
    assert nonzero(jq.stats()["default"]) == {"running": 1, "completed": 1, "claimed": 1}
    assert [j.id for j in jq.list_jobs(status=JobStatus.CLAIMED)] == [jobs[2].id]
    assert {j.id for j in jq.backend.job_held_by(worker_id=WORKER)} == {jobs[0].id, jobs[2].id}


def test_a_running_job_is_never_returned_for_free(jq):
    # "returned" (the rescuer's free return) needs the job still claimed: a
    # job whose start was recorded spends its attempt when its holder is lost.
    job = jq.enqueue("t", {})
    (held,) = claim(jq)
    jq.backend.job_start_many(claims=[claim_of(held)])
    assert fail(jq, held, "returned") == set()
    after = jq.get_job(job.id)
    assert after is not None and (after.status, after.attempt) == (JobStatus.RUNNING, 1)


def test_a_free_return_gives_the_attempt_back_and_counts_it(jq):
    job = jq.enqueue("t", {})
    for n in (1, 2):
        (held,) = claim(jq)
        assert fail(jq, held, "returned", error="worker lost") == {job.id}
        after = jq.get_job(job.id)
        assert after is not None
        assert (after.status, after.attempt, after.unstarted_returns, after.fence) == (
            JobStatus.AVAILABLE, 0, n, n
        )  # fmt: skip
    # A retry resets the count with the attempts.
    (held,) = claim(jq)
    fail(jq, held, "retryable", retry_in=3600)
    retried = jq.retry(job.id)
    assert (retried.attempt, retried.unstarted_returns) == (0, 0)


HAND_OUTS = [
    ("retryable", False),
    ("retryable", True),
    ("dead", False),
    ("dead", True),
    ("released", False),
    ("released", True),
    ("returned", False),
    ("cancelled", True),
]


@pytest.mark.parametrize(("outcome", "started"), HAND_OUTS)
def test_a_held_job_with_a_cancel_request_ends_cancelled_whatever_its_attempt_does(
    jq, outcome, started
):
    # As in river#141 and procrastinate#1133, the database decides,
    # so it holds however (or whether) the request reached the worker.
    job = jq.enqueue("t", {}, max_attempts=1 if outcome == "dead" else 5)
    (held,) = claim(jq)
    if started:
        jq.backend.job_start_many(claims=[claim_of(held)])
    assert jq.cancel(job.id).cancel_requested
    assert fail(jq, held, outcome, retry_in=0, error="it failed anyway") == {job.id}
    after = jq.get_job(job.id)
    assert after is not None
    assert after.status == JobStatus.CANCELLED
    assert after.worker_id is None and after.finished_at is not None
    assert [e["error"] for e in after.errors] == ["it failed anyway"]
    assert count(jq, "jobkeeper_dead_letters") == 0
    # Finished: nothing brings it back but a retry.
    jq.backend.job_stage_due()
    assert claim(jq) == []


@pytest.mark.parametrize("started", [False, True])
def test_a_held_job_with_a_cancel_request_that_succeeds_stays_completed(jq, started):
    job = jq.enqueue("t", {})
    (held,) = claim(jq)
    if started:
        jq.backend.job_start_many(claims=[claim_of(held)])
    jq.cancel(job.id)
    assert complete(jq, held, '{"done": true}') == {job.id}
    after = jq.get_job(job.id)
    assert after is not None
    assert (after.status, after.result) == (JobStatus.COMPLETED, {"done": True})


def test_a_mixed_batch_with_cancel_requests_splits_per_job(jq):
    jobs = jq.enqueue_many([("t", {"i": i}, {"max_attempts": 1}) for i in range(4)])
    held = claim(jq)
    jq.cancel(jobs[0].id)
    jq.cancel(jobs[2].id)
    failures = [
        Failure(claim_of(j), "dead", error_entry(j, "boom", None), reason="x") for j in held
    ]
    assert jq.backend.job_fail_many(failures=failures) == {j.id for j in jobs}
    statuses = [jq.get_job(j.id).status for j in jobs]  # type: ignore[union-attr]
    assert statuses == [
        JobStatus.CANCELLED,
        JobStatus.DEAD,
        JobStatus.CANCELLED,
        JobStatus.DEAD,
    ]
    assert count(jq, "jobkeeper_dead_letters") == 2
