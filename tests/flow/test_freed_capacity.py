"""A concurrency cap counts a job until its outcome is written, so a worker
writes the outcomes of a capped queue without lingering and claims into the
capacity they free at once, not at its next poll; both backends."""

from __future__ import annotations

import threading
from typing import Any

from jobkeeper.models import Completion
from jobkeeper.outcomes import claim_of
from jobkeeper.worker.completer import Completer
from support.db import sql
from support.waiting import DEADLINE, wait_for
from worker.helpers import running


def test_a_freed_slot_of_the_cap_is_claimed_into_before_the_next_poll(make_queue):
    # No poll for an hour, and a completer that would linger as long: only
    # the outcome written at once, and the wake-up after it, run the next job.
    jq = make_queue(poll_interval=3600.0)

    @jq.task()
    def quick() -> None:
        return None

    jq.configure_queue("q", concurrency=1)
    jq.enqueue_many([("quick", {}, {"queue": "q"})] * 3)
    worker = jq.worker(queues=["q"], concurrency=2, burst=True)
    worker.completer._flush_interval = 3600.0
    with running(worker) as run:
        run.join()  # burst: it stops once all three ran
    rows = sql(jq, "SELECT status FROM jobkeeper_jobs WHERE queue = 'q'")
    assert [status for (status,) in rows] == ["completed"] * 3


def test_a_freed_serial_key_is_claimed_into_before_the_next_poll(make_queue):
    # Noted by a break-test: on PostgreSQL each next job of a serial key
    # waited a poll_interval (4 jobs, 3.5 s with poll_interval=1). A keyed
    # job's outcome is written at once and the worker claims after it.
    jq = make_queue(poll_interval=3600.0)

    @jq.task(queue="q")
    def step(i: int) -> None:
        return None

    for i in range(4):
        step.options(serial_key="account:7").enqueue(i=i)
    worker = jq.worker(queues=["q"], concurrency=2, burst=True)
    worker.completer._flush_interval = 3600.0
    with running(worker) as run:
        run.join()  # burst: it stops once all four ran, one after another
    rows = sql(jq, "SELECT status FROM jobkeeper_jobs WHERE queue = 'q' ORDER BY id")
    assert [status for (status,) in rows] == ["completed"] * 4


def test_an_urgent_outcome_ends_the_linger_and_reports_its_write(jq):
    @jq.task()
    def job() -> None:
        return None

    j = job.enqueue()
    worker = jq.worker()
    jq.backend.worker_register(worker=worker.info)
    (claimed,) = jq.backend.job_claim(worker_id=worker.info.id, queue="default", limit=1)

    written: list[str] = []
    completer = Completer(
        jq.backend,
        delete_completed=False,
        flush_interval=3600.0,
        on_urgent_written=lambda: written.append(jq.get_job(j.id).status.value),
    )
    try:
        completer.add(Completion(claim_of(claimed), None), claimed, urgent=True)
        wait_for(lambda: written or None, what="the urgent outcome written")
    finally:
        completer.stop(DEADLINE)
    assert written == ["completed"]


def test_no_claim_of_a_capped_queue_while_its_outcomes_are_unwritten(make_queue):
    # The cap still counts the ended job until its outcome is written: a
    # claim meanwhile mostly finds it full, and takes the queue's lock from
    # the workers that could claim. The outcome's write is held open here
    # until a claim pass has started and ended during it.
    jq = make_queue(poll_interval=3600.0)

    @jq.task()
    def quick() -> None:
        return None

    jq.configure_queue("q", concurrency=1)
    jq.enqueue_many([("quick", {}, {"queue": "q"})] * 2)
    worker = jq.worker(queues=["q"], concurrency=2, burst=True)
    writing, release = threading.Event(), threading.Event()
    passes_during_write = threading.Event()
    claims_during_write: list[str] = []

    completer_backend = worker.completer._backend
    complete_many = completer_backend.job_complete_many

    def held_complete_many(**kwargs: Any) -> set[int]:
        writing.set()
        release.wait(DEADLINE)
        return complete_many(**kwargs)

    completer_backend.job_complete_many = held_complete_many
    producer = worker.producer
    claim_pass = producer._claim
    job_claim = producer._backend.job_claim
    in_write_pass = threading.local()

    def watched_pass() -> int:
        in_write_pass.yes = writing.is_set() and not release.is_set()
        try:
            return claim_pass()
        finally:
            if in_write_pass.yes:
                passes_during_write.set()

    def watched_claim(**kwargs: Any) -> list[Any]:
        if getattr(in_write_pass, "yes", False):
            claims_during_write.append(kwargs["queue"])
        return job_claim(**kwargs)

    producer._claim = watched_pass
    producer._backend.job_claim = watched_claim
    with running(worker) as run:
        assert writing.wait(DEADLINE)
        producer.wake()
        assert passes_during_write.wait(DEADLINE)
        release.set()
        run.join()
    assert claims_during_write == []
    rows = sql(jq, "SELECT status FROM jobkeeper_jobs WHERE queue = 'q'")
    assert [status for (status,) in rows] == ["completed"] * 2
