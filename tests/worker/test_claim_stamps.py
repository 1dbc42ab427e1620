"""A worker's record of when it claimed what (worker/claims.py) is kept per
claim: a job handed back while the worker was silent and claimed by it again
is two claims, and the old one must not pass for held.
"""

from __future__ import annotations

import dataclasses

from jobkeeper import JobStatus
from jobkeeper.outcomes import returned_attempt
from support.db import sql

from .helpers import claims_of


class _Heartbeat:
    """A heartbeat whose stale spells the test counts by hand."""

    def __init__(self) -> None:
        self.spells = 0

    def liveness(self) -> tuple[float, int]:
        return 0.0, self.spells


def test_an_old_claim_of_a_job_claimed_again_is_not_held(jq):
    # Seen in the PostgreSQL chaos soak (test_short_chaos_soak): a job
    # prefetched, then handed back as unstarted while its worker was cut
    # off, was claimed again by the same worker; keyed by job id, the new
    # claim's stamp let the old buffered execution start too, and the task
    # ran twice at once on one worker ("two live holders").
    job = jq.enqueue("t", {})
    (first,) = jq.backend.job_claim(worker_id="w:1:aaaa", queue="default", limit=1)
    assert first.id == job.id
    heartbeat = _Heartbeat()
    claims = claims_of(jq.backend, "w:1:aaaa", heartbeat)
    claims.claimed([first], claims.stamp())
    assert claims.still_held(first)
    heartbeat.spells += 1  # silent long enough for a rescuer: the claim is not ours to trust
    assert not claims.still_held(first)
    again = dataclasses.replace(first, fence=first.fence + 1)  # handed back, claimed again
    claims.claimed([again], claims.stamp())
    assert claims.still_held(again)
    assert not claims.still_held(first)
    claims.forget(first)
    assert claims.still_held(again)
    claims.forget(again)
    assert not claims.still_held(again)


class _Starts:
    """A completer that only records the start marks it is given to batch."""

    def __init__(self) -> None:
        self.batched: list[object] = []

    def add_start(self, claim: object) -> None:
        self.batched.append(claim)


def _returned_once(jq, worker_id: str):
    """A job returned unstarted once before, claimed now by ``worker_id``."""
    job = jq.enqueue("t", {})
    sql(jq, "UPDATE jobkeeper_jobs SET unstarted_returns = 1 WHERE id = ?", [job.id])
    (claimed,) = jq.backend.job_claim(worker_id=worker_id, queue="default", limit=1)
    assert claimed.unstarted_returns == 1
    return claimed


def test_a_job_returned_unstarted_before_is_marked_running_before_its_call(jq):
    starts = _Starts()
    claims = claims_of(jq.backend, "w:1:aaaa", _Heartbeat(), starts)
    job = _returned_once(jq, "w:1:aaaa")
    claims.claimed([job], claims.stamp())
    assert claims.may_start(job)
    # Written by may_start, before the executor's last check and the call.
    assert jq.get_job(job.id).status == JobStatus.RUNNING
    claims.started(job)
    assert starts.batched == []  # not marked twice


def test_a_lost_claim_of_a_job_returned_before_does_not_start(jq):
    # Break-test 15: such a job's start mark was written after the
    # executor's last check, and its result ignored. Held up by a partition
    # past rescue_after, it matched nothing (the job had been rescued and
    # claimed by another worker), and the task was called anyway, beside the
    # next holder.
    claims = claims_of(jq.backend, "w:1:aaaa", _Heartbeat(), _Starts())
    job = _returned_once(jq, "w:1:aaaa")
    claims.claimed([job], claims.stamp())
    assert jq.backend.job_fail_many(failures=[returned_attempt(job)]) == {job.id}
    (again,) = jq.backend.job_claim(worker_id="w:2:bbbb", queue="default", limit=1)
    assert again.id == job.id and again.fence != job.fence
    assert not claims.may_start(job)
    assert jq.get_job(job.id).worker_id == "w:2:bbbb"
