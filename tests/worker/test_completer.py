"""The completer's report of what it wrote: an outcome counts as written only
when its own claim was, not another claim of the same job.
"""

from __future__ import annotations

import threading

from jobkeeper import JobStatus
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.models import Completion
from jobkeeper.outcomes import claim_of, released_attempt
from jobkeeper.worker.completer import Completer, Outcome
from support.waiting import DEADLINE


def test_a_stale_hand_back_batched_with_its_jobs_next_claim_is_reported_lost(jq):
    # A worker back from a silent spell stops an attempt whose claim was
    # rescued; it may claim the same job again before the stale hand-back is
    # flushed, so one batch holds both. The database refuses the stale one
    # (its fence) and writes the other; the report must say which is which.
    @jq.task()
    def job() -> None:
        return None

    j = job.enqueue()
    worker = jq.worker()
    jq.backend.worker_register(worker=worker.info)
    (first,) = jq.backend.job_claim(worker_id=worker.info.id, queue="default", limit=1)
    jq.backend.job_fail_many(failures=[released_attempt(first, "rescued")])
    (second,) = jq.backend.job_claim(worker_id=worker.info.id, queue="default", limit=1)
    assert second.fence > first.fence

    reports: list[tuple[list[Outcome], set[int]]] = []
    events: list[JobEvent] = []
    done = threading.Event()
    bus = EventBus()
    bus.subscribe(events.append, None)

    def on_written(outcomes: list[Outcome], written: set[int]) -> None:
        reports.append((outcomes, written))
        if sum(len(o) for o, _ in reports) == 2:
            done.set()

    completer = Completer(
        jq.backend, delete_completed=False, flush_interval=0.5, on_written=on_written, events=bus
    )
    try:
        stale = released_attempt(first, "claim lost while this worker was silent: stopped")
        completer.add(stale, first)
        completer.add(Completion(claim_of(second), None), second)
        assert done.wait(DEADLINE)
    finally:
        completer.stop(DEADLINE)

    assert jq.get_job(j.id).status == JobStatus.COMPLETED
    written_claims = [
        outcome.claim
        for outcomes, written in reports
        for outcome in outcomes
        if outcome.claim.job_id in written
    ]
    assert written_claims == [claim_of(second)]
    seen = [(e.kind, e.outcome) for e in events]
    assert seen.count((EventKind.CLAIM_LOST, None)) == 1, seen
    assert [o for k, o in seen if k == EventKind.ACKED] == ["completed"], seen
