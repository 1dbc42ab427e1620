"""Claiming, fenced acknowledgements and the dead-letter move on both backends
(guarantees 2, 3, 4; the longest backoff is storable).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from jobkeeper import JobStatus
from jobkeeper.models import Claim, Completion, Failure
from jobkeeper.outcomes import error_entry
from support.db import count

from .helpers import WORKER, claim, claim_of, complete, fail, register


def claim_one_by_one(jq, queue="default"):
    order = []
    while batch := claim(jq, queue, limit=1):
        assert len(batch) == 1
        order.append(batch[0].id)
    return order


def test_claim_order_is_priority_then_scheduled_at_then_id(jq):
    now = datetime.now(UTC)
    late = jq.enqueue("t", {"n": "late"}, run_at=now - timedelta(minutes=1))
    early = jq.enqueue("t", {"n": "early"}, run_at=now - timedelta(minutes=10))
    urgent = jq.enqueue("t", {"n": "urgent"}, priority=-5)
    low = jq.enqueue("t", {"n": "low"}, priority=10, run_at=now - timedelta(hours=5))
    same1 = jq.enqueue("t", {"n": "same1"}, run_at=now - timedelta(minutes=30))
    same2 = jq.enqueue("t", {"n": "same2"}, run_at=now - timedelta(minutes=30))
    other_queue = jq.enqueue("t", {}, queue="other", priority=-100)
    scheduled = jq.enqueue("t", {}, priority=-100, delay=3600)

    expected = [urgent.id, same1.id, same2.id, early.id, late.id, low.id]
    assert claim_one_by_one(jq) == expected
    assert other_queue.id not in expected and scheduled.id not in expected


def test_claim_batch_is_ordered_and_limited(jq):
    jobs = jq.enqueue_many([("t", {"i": i}, {"priority": 5 - i}) for i in range(6)])
    batch = claim(jq, limit=4)
    assert [j.id for j in batch] == [jobs[i].id for i in (5, 4, 3, 2)]
    assert all(j.status == JobStatus.CLAIMED and j.fence == 1 for j in batch)
    assert all(j.worker_id == WORKER and j.attempt == 1 for j in batch)
    assert all(j.attempted_at is not None for j in batch)
    assert count(jq, where="status = 'claimed'") == 4
    assert len(claim(jq, limit=100)) == 2
    assert claim(jq) == []


def test_concurrent_claims_never_share_a_job(jq):
    jq.enqueue_many([("t", {"i": i}) for i in range(200)])
    claimed: dict[str, list[int]] = {}
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            register(jq, name)
            barrier.wait()
            mine = claimed.setdefault(name, [])
            while batch := jq.backend.job_claim(worker_id=name, queue="default", limit=7):
                mine.extend(j.id for j in batch)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    every = [job_id for ids in claimed.values() for job_id in ids]
    assert len(every) == 200
    assert len(set(every)) == 200


# -- fenced writes -----------------------------------------------------------------------


def test_complete_is_fenced_on_worker_and_attempt(jq):
    job = jq.enqueue("t", {})
    (running,) = claim(jq)
    wrong_worker = Claim(job.id, "someone-else", running.attempt, running.fence)
    wrong_attempt = Claim(job.id, WORKER, running.attempt + 1, running.fence)
    old_attempt = Claim(job.id, WORKER, running.attempt - 1, running.fence)
    old_fence = Claim(job.id, WORKER, running.attempt, running.fence - 1)
    for fence in (wrong_worker, wrong_attempt, old_attempt, old_fence):
        assert complete(jq, running, '{"x":1}', claim_=fence) == set()
        assert (
            jq.backend.job_complete_many(completions=[Completion(fence, None)], delete=True)
            == set()
        )
    still = jq.get_job(job.id)
    assert still is not None
    assert (still.status, still.worker_id, still.result) == (JobStatus.CLAIMED, WORKER, None)
    assert complete(jq, running, '{"x":1}') == {job.id}
    done = jq.get_job(job.id)
    assert done is not None and done.status == JobStatus.COMPLETED and done.result == {"x": 1}
    # A second (late, duplicate) completion writes nothing.
    assert complete(jq, running, '{"x":2}') == set()
    again = jq.get_job(job.id)
    assert again is not None and again.result == {"x": 1}


@pytest.mark.parametrize("outcome", ["retryable", "dead", "cancelled", "released"])
def test_fail_is_fenced_on_worker_and_attempt(jq, outcome):
    job = jq.enqueue("t", {})
    (running,) = claim(jq)
    for fence in (
        Claim(job.id, "intruder", 1, 1),
        Claim(job.id, WORKER, 2, 1),
        Claim(job.id, WORKER, 0, 1),
        Claim(job.id, WORKER, 1, 0),
    ):
        assert fail(jq, running, outcome, claim_=fence) == set()
    still = jq.get_job(job.id)
    assert still is not None
    assert (still.status, still.errors, still.attempt) == (JobStatus.CLAIMED, [], 1)
    assert count(jq, "jobkeeper_dead_letters") == 0
    assert fail(jq, running, outcome) == {job.id}
    assert fail(jq, running, outcome) == set()
    after = jq.get_job(job.id)
    assert after is not None
    expected = {
        "retryable": JobStatus.RETRYABLE,
        "dead": JobStatus.DEAD,
        "cancelled": JobStatus.CANCELLED,
        "released": JobStatus.AVAILABLE,
    }[outcome]
    assert after.status == expected
    assert len(after.errors) == 1
    assert after.attempt == (0 if outcome == "released" else 1)
    assert after.worker_id is None


def test_batched_acks_write_only_their_own_claims(jq):
    jobs = jq.enqueue_many([("t", {"i": i}) for i in range(4)])
    running = claim(jq)
    fences = [claim_of(j) for j in running]
    fences[1] = Claim(fences[1].job_id, "stale-worker", fences[1].attempt, fences[1].fence)
    written = jq.backend.job_complete_many(
        completions=[Completion(f, None) for f in fences[:2]], delete=False
    )
    assert written == {jobs[0].id}
    entry = error_entry(running[2], "x", None)
    failures = [
        Failure(fences[2], "retryable", entry, retry_in=0),
        Failure(Claim(jobs[3].id, WORKER, 99, 1), "dead", entry, reason="x"),
        Failure(fences[1], "dead", entry, reason="x"),
    ]
    assert jq.backend.job_fail_many(failures=failures) == {jobs[2].id}
    statuses = [jq.get_job(j.id).status for j in jobs]  # type: ignore[union-attr]
    assert statuses == [
        JobStatus.COMPLETED,
        JobStatus.CLAIMED,
        JobStatus.RETRYABLE,
        JobStatus.CLAIMED,
    ]
    assert count(jq, "jobkeeper_dead_letters") == 0


def test_retryable_is_staged_after_its_backoff(jq):
    job = jq.enqueue("t", {})
    (running,) = claim(jq)
    assert fail(jq, running, retry_in=3600) == {job.id}
    retryable = jq.get_job(job.id)
    assert retryable is not None and retryable.status == JobStatus.RETRYABLE
    db_now = jq.backend.db_now()
    assert abs(retryable.scheduled_at - (db_now + timedelta(hours=1))) < timedelta(seconds=5)
    assert jq.backend.job_stage_due().staged == 0
    other = jq.enqueue("t", {})
    (running2,) = claim(jq)
    assert running2.id == other.id
    assert fail(jq, running2, retry_in=0) == {other.id}
    assert jq.backend.job_stage_due().staged == 1
    (again,) = claim(jq)
    assert (again.id, again.attempt) == (other.id, 2)


# -- dead letters ------------------------------------------------------------------------


def test_dead_letter_move_keeps_the_whole_history(jq):
    job = jq.enqueue("t", {"a": [1, "x"]}, max_attempts=2, priority=3, unique_key="u")
    (first,) = claim(jq)
    assert fail(jq, first, "retryable", error="first failure") == {job.id}
    jq.backend.job_stage_due()
    (second,) = claim(jq)
    assert second.attempt == 2
    assert fail(jq, second, "dead", error="second failure") == {job.id}
    assert count(jq) == 0
    assert count(jq, "jobkeeper_dead_letters") == 1
    dead = jq.get_job(job.id)
    assert dead is not None
    assert dead.status == JobStatus.DEAD
    assert (dead.args, dead.priority, dead.attempt, dead.max_attempts) == (
        {"a": [1, "x"]},
        3,
        2,
        2,
    )
    assert dead.unique_key == "u"
    assert [(e["attempt"], e["error"]) for e in dead.errors] == [
        (1, "first failure"),
        (2, "second failure"),
    ]
    assert dead.created_at == job.created_at
    assert dead.finished_at is not None


def test_dead_letter_move_is_atomic_under_racing_writers(jq):
    """Eight threads fail the same claim to the dead letters at once: exactly
    one write wins and the job is in exactly one table.
    """
    jobs = jq.enqueue_many([("t", {"i": i}) for i in range(5)])
    running = claim(jq)
    results: list[set[int]] = []
    barrier = threading.Barrier(8)

    def racer() -> None:
        barrier.wait()
        entry = error_entry(running[0], "race", None)
        failures = [Failure(claim_of(j), "dead", entry, reason="race") for j in running]
        results.append(jq.backend.job_fail_many(failures=failures))

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 8
    winners = [r for r in results if r]
    assert winners == [{j.id for j in jobs}]
    assert count(jq) == 0
    assert count(jq, "jobkeeper_dead_letters") == 5
    for job in jobs:
        in_jobs = count(jq, where=f"id = {job.id}")
        in_dead = count(jq, "jobkeeper_dead_letters", where=f"id = {job.id}")
        assert (in_jobs, in_dead) == (0, 1)
        dead = jq.get_job(job.id)
        assert dead is not None and len(dead.errors) == 1


def test_every_job_is_in_exactly_one_table_through_requeue_cycles(jq):
    job = jq.enqueue("t", {})
    for _ in range(3):
        (running,) = claim(jq)
        assert fail(jq, running, "dead") == {job.id}
        assert (count(jq), count(jq, "jobkeeper_dead_letters")) == (0, 1)
        assert jq.requeue_dead([job.id]) == [job.id]
        assert (count(jq), count(jq, "jobkeeper_dead_letters")) == (1, 0)
    final = jq.get_job(job.id)
    assert final is not None and len(final.errors) == 3


def test_claimed_jobs_carry_their_own_timestamps_as_utc(jq):
    # The PostgreSQL claim memoises timestamp conversions within a batch: rows
    # with different times must still each get their own, aware, in UTC.
    now = datetime.now(UTC)
    past = [now - timedelta(minutes=m) for m in (30, 20, 10)]
    jobs = [jq.enqueue("t", {"i": i}, run_at=at) for i, at in enumerate(past)]
    jobs += jq.enqueue_many([("t", {"i": i}) for i in range(3, 6)])
    claimed = {j.id: j for j in claim(jq, limit=10)}
    assert len(claimed) == 6
    attempted = {j.attempted_at for j in claimed.values()}
    assert len(attempted) == 1
    for job in jobs:
        got, stored = claimed[job.id], jq.get_job(job.id)
        assert got.scheduled_at == stored.scheduled_at == job.scheduled_at
        assert got.created_at == stored.created_at
        assert got.attempted_at == stored.attempted_at
        for value in (got.scheduled_at, got.created_at, got.attempted_at):
            assert value is not None and value.utcoffset() == timedelta(0)
    assert [claimed[j.id].scheduled_at for j in jobs[:3]] == [j.scheduled_at for j in jobs[:3]]
    assert len({claimed[j.id].scheduled_at for j in jobs[:3]}) == 3
