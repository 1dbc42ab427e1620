"""A worker serving many queues asks once per pass which of them hold an
available job, and claims only from those (``Producer._claim_order``): it
claimed from every queue it served on every pass, empty or not, so 5,000
queues made an idle worker run 4,265 statements a second.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from jobkeeper import JobQueue, JobStatus
from support.waiting import wait_status

from .helpers import running

QUEUES = [f"q{i:03}" for i in range(200)]


def _log_claims(worker: Any) -> tuple[list[tuple[str, int]], list[int]]:
    """The producer's claims as (queue, jobs taken), and one entry per
    ``queues_with_available`` asked (its answer's length).
    """
    claims: list[tuple[str, int]] = []
    probes: list[int] = []
    lock = threading.Lock()
    backend = worker.producer._backend
    job_claim, probe = backend.job_claim, backend.queues_with_available

    def claim(**kwargs: Any) -> Any:
        jobs = job_claim(**kwargs)
        with lock:
            claims.append((kwargs["queue"], len(jobs)))
        return jobs

    def available(**kwargs: Any) -> Any:
        found = probe(**kwargs)
        with lock:
            probes.append(len(found))
        return found

    backend.job_claim = claim
    backend.queues_with_available = available
    return claims, probes


def _task(jq: JobQueue) -> None:
    @jq.task
    def noop() -> None:
        pass


def test_the_probe_lists_queues_with_available_jobs_in_the_order_given(jq):
    _task(jq)
    jq.enqueue("noop", {}, queue="b")
    jq.enqueue("noop", {}, queue="d")
    jq.enqueue("noop", {}, queue="c", run_at=datetime.now(UTC) + timedelta(hours=1))
    jq.pause("d")  # a claim decides, not the probe
    names = ["d", "a", "c", "b"]
    assert jq.backend.queues_with_available(queues=names) == ["d", "b"]
    assert jq.backend.queues_with_available(queues=[]) == []
    many = [f"n{i}" for i in range(5000)] + ["b"]  # past SQLite's 32,766 parameters too
    assert jq.backend.queues_with_available(queues=many) == ["b"]


def test_a_worker_of_200_queues_claims_only_from_the_one_with_jobs(make_queue):
    jq = make_queue()
    _task(jq)
    ids = [jq.enqueue("noop", {}, queue="q137").id for _ in range(30)]
    worker = jq.worker(queues=QUEUES, concurrency=2, prefetch=0, burst=True)
    claims, probes = _log_claims(worker)
    worker.run()
    wait_status(jq, ids, {JobStatus.COMPLETED})
    assert {queue for queue, _ in claims} == {"q137"}, claims[:10]
    # One claim statement a pass at most (one queue has jobs), not 200.
    assert len(claims) <= len(probes), (len(claims), len(probes))


def test_a_queue_given_a_job_after_a_pass_is_claimed_at_the_wake_up(make_queue):
    jq = make_queue(poll_interval=3600.0)
    _task(jq)
    first = jq.enqueue("noop", {}, queue="q000").id
    worker = jq.worker(queues=QUEUES, concurrency=2)
    claims, probes = _log_claims(worker)
    with running(worker):
        wait_status(jq, [first], {JobStatus.COMPLETED})
        asked = len(probes)
        later = jq.enqueue("noop", {}, queue="q199").id
        wait_status(jq, [later], {JobStatus.COMPLETED})
    assert len(probes) > asked
    assert ("q199", 1) in claims
    assert all(queue in {"q000", "q199"} for queue, _ in claims), claims[:10]


def test_the_rotation_turns_among_the_queues_with_jobs(make_queue):
    jq = make_queue()
    _task(jq)
    busy = ["q010", "q100", "q150"]
    ids = [jq.enqueue("noop", {}, queue=queue).id for _ in range(4) for queue in busy]
    # One job a pass: the order of claims is the rotation's.
    worker = jq.worker(queues=QUEUES, concurrency=1, prefetch=0, burst=True)
    claims, _ = _log_claims(worker)
    worker.run()
    wait_status(jq, ids, {JobStatus.COMPLETED})
    taken = [queue for queue, jobs in claims if jobs]
    assert len(taken) == 12
    # Turning over all 200 queues, q010 came first for the first eleven
    # passes and was drained before the others had a job claimed.
    for at in range(0, 9, 3):
        assert sorted(taken[at : at + 3]) == busy, taken


def test_a_worker_of_a_few_queues_claims_as_before_without_the_probe(make_queue):
    jq = make_queue()
    _task(jq)
    few = QUEUES[:8]
    ids = [jq.enqueue("noop", {}, queue=queue).id for queue in few]
    worker = jq.worker(queues=few, concurrency=2, burst=True)
    claims, probes = _log_claims(worker)
    worker.run()
    wait_status(jq, ids, {JobStatus.COMPLETED})
    assert probes == []
    assert {queue for queue, _ in claims} == set(few)
