"""The event seam: what a listener of ``JobQueue.on_event`` sees of each
job's life in a worker and a rescuer, on both backends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from jobkeeper import JobQueue, JobStatus, Retry
from jobkeeper.events import EventKind, JobEvent, OutcomeKind
from jobkeeper.maintenance.rescuer import Rescuer
from jobkeeper.models import WorkerInfo
from jobkeeper.outcomes import claim_of
from support.waiting import wait_for, wait_status

from .helpers import gated_task, lose_claim_mid_run, running


class Recorder:
    """Collects events, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[JobEvent] = []

    def __call__(self, event: JobEvent) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, job_id: int) -> list[JobEvent]:
        with self._lock:
            return [e for e in self.events if e.job_id == job_id]

    def kinds(self, job_id: int) -> list[tuple[str, str | None]]:
        return [
            (e.kind.value, e.outcome.value if e.outcome is not None else None)
            for e in self.of(job_id)
        ]

    def wait_for_kind(self, job_id: int, kind: EventKind, count: int = 1) -> None:
        wait_for(
            lambda: sum(e.kind == kind for e in self.of(job_id)) >= count,
            what=f"{count} {kind.value} events of job {job_id}",
        )


def _run(jq: JobQueue, job_ids: list[int], statuses: set[JobStatus], **worker: Any) -> None:
    with running(jq.worker(**worker)):
        wait_status(jq, job_ids, statuses)


def test_a_completed_job_is_claimed_started_finished_and_acked(jq):
    recorder = Recorder()
    jq.on_event(recorder)

    @jq.task
    def add(a: int, b: int) -> int:
        return a + b

    j = add.enqueue(a=1, b=2)
    with running(jq.worker(concurrency=1)):
        wait_status(jq, [j.id], {JobStatus.COMPLETED})
        recorder.wait_for_kind(j.id, EventKind.ACKED)
    assert recorder.kinds(j.id) == [
        ("claimed", None),
        ("started", None),
        ("finished", "completed"),
        ("acked", "completed"),
    ]
    events = recorder.of(j.id)
    assert {(e.task, e.queue, e.attempt) for e in events} == {("add", "default", 1)}
    finished = events[2]
    assert finished.duration is not None and finished.duration >= 0
    assert finished.error is None and finished.job is not None


def test_a_failed_attempt_is_retried_then_dead_lettered(make_queue):
    jq = make_queue()
    recorder = Recorder()
    jq.on_event(recorder)

    @jq.task(max_attempts=2)
    def flaky() -> None:
        raise ValueError("boom")

    j = flaky.enqueue()
    with running(jq.worker(concurrency=1)):
        wait_status(jq, [j.id], {JobStatus.DEAD})
        recorder.wait_for_kind(j.id, EventKind.DEAD_LETTERED)
    assert recorder.kinds(j.id) == [
        ("claimed", None),
        ("started", None),
        ("finished", "retried"),
        ("acked", "retried"),
        ("claimed", None),
        ("started", None),
        ("finished", "dead"),
        ("acked", "dead"),
        ("dead_lettered", None),
    ]
    events = recorder.of(j.id)
    assert [e.attempt for e in events] == [1, 1, 1, 1, 2, 2, 2, 2, 2]
    assert events[2].error == "ValueError: boom"
    assert events[6].error == "ValueError: boom"
    assert events[8].error is not None and "max_attempts=2 exhausted" in events[8].error


def test_a_retry_request_is_a_retried_outcome(jq):
    recorder = Recorder()
    jq.on_event(recorder)
    calls: list[int] = []

    @jq.task
    def again() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise Retry(delay=0.01, reason="not yet")

    j = again.enqueue()
    _run(jq, [j.id], {JobStatus.COMPLETED}, concurrency=1)
    recorder.wait_for_kind(j.id, EventKind.ACKED, count=2)
    finished = [e for e in recorder.of(j.id) if e.kind == EventKind.FINISHED]
    assert [e.outcome for e in finished] == [OutcomeKind.RETRIED, OutcomeKind.COMPLETED]
    assert finished[0].error == "Retry: not yet"


def test_a_cancelled_running_job_finishes_cancelled(jq):
    recorder = Recorder()
    jq.on_event(recorder)
    started = threading.Event()

    @jq.task
    def waits() -> None:
        started.set()
        for _ in range(3000):  # short sleeps: the cancel lands between two
            time.sleep(0.01)

    j = waits.enqueue()
    with running(jq.worker(concurrency=1)):
        assert started.wait(30)
        jq.cancel(j.id)
        wait_status(jq, [j.id], {JobStatus.CANCELLED})
        recorder.wait_for_kind(j.id, EventKind.ACKED)
    assert recorder.kinds(j.id) == [
        ("claimed", None),
        ("started", None),
        ("finished", "cancelled"),
        ("acked", "cancelled"),
    ]


def test_a_rescue_is_emitted_with_the_lost_holder(jq):
    recorder = Recorder()
    jq.on_event(recorder)
    holder = "lost:1:beef"
    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo(holder, "host", 1, ["default"], now, now))
    j = jq.enqueue("anything", {}, max_attempts=1)
    (claimed,) = jq.backend.job_claim(worker_id=holder, queue="default", limit=1)
    assert jq.backend.job_start_many(claims=[claim_of(claimed)]) == {j.id}
    jq.backend.worker_deregister(worker_id=holder)  # gone: rescued on the next pass
    backend = jq.backend.dedicated()
    rescuer = Rescuer(backend, jq.settings, 0.05, events=jq.events)
    rescuer.start()
    try:
        wait_status(jq, [j.id], {JobStatus.DEAD})
        recorder.wait_for_kind(j.id, EventKind.DEAD_LETTERED)
    finally:
        rescuer.stop()
        backend.close()
    assert recorder.kinds(j.id) == [("rescued", "dead"), ("dead_lettered", None)]
    rescued = recorder.of(j.id)[0]
    assert rescued.worker_id == holder and rescued.attempt == 1
    assert rescued.error is not None and "worker lost" in rescued.error


def test_a_claim_lost_before_the_ack_is_emitted(jq):
    # The worker's claim is rescued from under it (its heartbeat paused past
    # rescue_after); its outcome is refused by the fence.
    recorder = Recorder()
    jq.on_event(recorder)
    slow, gate = gated_task(jq)
    j = slow.enqueue()
    worker = jq.worker(concurrency=1)
    with running(worker):
        recorder.wait_for_kind(j.id, EventKind.STARTED)
        lose_claim_mid_run(jq, worker, j.id, gate)
        recorder.wait_for_kind(j.id, EventKind.CLAIM_LOST)
        worker.heartbeat.paused = False
    lost = [e for e in recorder.of(j.id) if e.kind == EventKind.CLAIM_LOST]
    assert lost[0].worker_id == worker.info.id


def test_a_raising_listener_never_stops_the_worker(jq, caplog):
    seen: list[JobEvent] = []

    def broken(event: JobEvent) -> None:
        raise RuntimeError("listener bug")

    jq.on_event(broken)
    jq.on_event(seen.append)

    @jq.task
    def noop() -> None:
        pass

    jobs = [noop.enqueue() for _ in range(5)]
    _run(jq, [j.id for j in jobs], {JobStatus.COMPLETED}, concurrency=2)
    assert "listener bug" in caplog.text
    # The listener after the broken one still heard every ack.
    wait_for(lambda: {e.job_id for e in seen if e.kind == EventKind.ACKED} >= {j.id for j in jobs})


def test_nobody_listening_builds_no_event(jq, monkeypatch):
    # Emitting costs one attribute test: with no listener (the worker's own
    # log listener aside, which is off the bus here) no event is built.
    built: list[Any] = []
    original: Callable[..., JobEvent] = JobEvent.of.__func__  # type: ignore[attr-defined]

    def counting(cls: type[JobEvent], *args: Any, **kwargs: Any) -> JobEvent:
        built.append(args[0])
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(JobEvent, "of", classmethod(counting))
    monkeypatch.setattr("jobkeeper.joblog.install", lambda bus: lambda: None)

    @jq.task
    def noop() -> None:
        pass

    j = noop.enqueue()
    _run(jq, [j.id], {JobStatus.COMPLETED}, concurrency=1)
    assert built == []
