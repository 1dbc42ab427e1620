"""The completer's report of what it wrote: an outcome counts as written only
when its own claim was, not another claim of the same job.
"""

from __future__ import annotations

import threading
from typing import Any

from jobkeeper import JobStatus
from jobkeeper.errors import DatabaseUnavailable
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.models import Completion
from jobkeeper.outcomes import claim_of, released_attempt
from jobkeeper.worker.completer import Completer, Outcome
from support.waiting import DEADLINE, wait_for


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


class _Recording:
    """A backend wrapper that records the completer's start-mark and
    completion writes, and fails the next ``fail_starts`` start-mark writes.
    """

    def __init__(self, backend: Any, fail_starts: int = 0, before_failing: Any = None) -> None:
        self._backend = backend
        self.fail_starts = fail_starts
        #: Called (on the writer thread) as a start-mark write fails.
        self.before_failing = before_failing
        self.calls: list[tuple[str, list[int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def job_start_many(self, *, claims: Any) -> set[int]:
        self.calls.append(("start", [c.job_id for c in claims]))
        if self.fail_starts:
            self.fail_starts -= 1
            if self.before_failing is not None:
                self.before_failing()
            raise DatabaseUnavailable("injected: start marks not written")
        result: set[int] = self._backend.job_start_many(claims=claims)
        return result

    def job_complete_many(self, *, completions: Any, delete: bool) -> set[int]:
        self.calls.append(("complete", [c.claim.job_id for c in completions]))
        result: set[int] = self._backend.job_complete_many(completions=completions, delete=delete)
        return result


def _claimed(jq: Any, count: int) -> list[Any]:
    @jq.task()
    def job() -> None:
        return None

    jq.enqueue_many([("job", {})] * count)
    worker = jq.worker()
    jq.backend.worker_register(worker=worker.info)
    return jq.backend.job_claim(worker_id=worker.info.id, queue="default", limit=count)


def test_a_start_mark_whose_outcome_arrives_first_is_never_written(jq):
    first, second = _claimed(jq, 2)
    backend = _Recording(jq.backend)
    completer = Completer(backend, delete_completed=False, flush_interval=3600.0)
    try:
        completer.add_start(claim_of(first))
        completer.add_start(claim_of(second))
        completer.add(Completion(claim_of(first), None), first)
        assert completer.pending_ids() == {first.id, second.id}
    finally:
        assert completer.stop(DEADLINE)
    # The linger ended with the stop: one flush, the mark of the job still
    # running first, then the completion; none for the completed job.
    assert backend.calls == [("start", [second.id]), ("complete", [first.id])]
    assert jq.get_job(first.id).status == JobStatus.COMPLETED
    assert jq.get_job(second.id).status == JobStatus.RUNNING


def test_start_marks_not_written_are_retried_before_the_outcomes_behind_them(jq):
    first, second = _claimed(jq, 2)
    done = threading.Event()
    completer: Completer

    def meanwhile() -> None:
        # While the first mark's write fails: another job starts, and the
        # first one's outcome arrives. The failed mark is put back only for
        # the claim still without an outcome.
        completer.add_start(claim_of(second))
        completer.add(Completion(claim_of(first), None), first)

    backend = _Recording(jq.backend, fail_starts=1, before_failing=meanwhile)
    completer = Completer(
        backend,
        delete_completed=False,
        flush_interval=0.0,
        on_written=lambda outcomes, written: done.set(),
    )
    try:
        completer.add_start(claim_of(first))
        assert done.wait(DEADLINE)
    finally:
        assert completer.stop(DEADLINE)
    # The mark first, then the outcome behind it; the first job's mark never again.
    assert backend.calls == [
        ("start", [first.id]),
        ("start", [second.id]),
        ("complete", [first.id]),
    ]
    assert jq.get_job(first.id).status == JobStatus.COMPLETED
    assert jq.get_job(second.id).status == JobStatus.RUNNING


class _CountingBackend:
    """Stands in for a backend: counts the round trips that open a connection."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.called = threading.Event()

    def db_now(self) -> Any:
        self.calls += 1
        self.called.set()
        if self.fail:
            raise DatabaseUnavailable("down")
        return None


def test_warm_opens_the_connection_on_the_writers_thread_and_only_when_asked():
    # The worker asks once it runs, so its first outcomes do not wait on a
    # connect; a worker that is only built (tests, tools) opens nothing.
    backend = _CountingBackend()
    completer = Completer(backend, delete_completed=False)  # type: ignore[arg-type]
    try:
        assert not backend.called.wait(0.2)
        completer.warm()
        assert backend.called.wait(DEADLINE)
    finally:
        assert completer.stop(DEADLINE)
    assert backend.calls == 1


def test_a_warm_up_that_fails_leaves_the_writer_running():
    backend = _CountingBackend(fail=True)
    completer = Completer(backend, delete_completed=False)  # type: ignore[arg-type]
    try:
        completer.warm()
        wait_for(lambda: backend.calls == 1, what="the first warm-up")
        completer.warm()
        wait_for(lambda: backend.calls == 2, what="a second warm-up, after the first's error")
    finally:
        assert completer.stop(DEADLINE)
