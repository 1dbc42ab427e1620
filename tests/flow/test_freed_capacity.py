"""A concurrency cap counts a job until its outcome is written, so a worker
writes the outcomes of a capped queue without lingering and claims into the
capacity they free at once, not at its next poll; both backends."""

from __future__ import annotations

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
