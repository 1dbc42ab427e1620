"""An attempt whose code has not returned keeps its job held.

A timeout, a cancel request or a stop past the grace period asks the code to
stop; the outcome is recorded only once it has returned. Code stuck where the
interrupt cannot reach it (a C call such as ``select``; an async task that
blocks its event loop) must never run beside its own retry.
"""

from __future__ import annotations

import itertools
import logging
import select
import threading
import time
from typing import Any

import pytest

from jobkeeper import EventKind, JobQueue, JobStateError, JobStatus, current_job
from support.db import job
from support.waiting import DEADLINE, wait_for, wait_status

from .helpers import error_texts, running

#: Seconds the stuck code sleeps in C, well past its timeout.
STUCK = 2.0


def sleep_in_c(seconds: float) -> None:
    """One C call no interrupt ends (a worker ends ``time.sleep`` early)."""
    select.select([], [], [], seconds)


class Attempts:
    """Start and end times (``time.monotonic()``) of every attempt, per worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[dict[str, Any]] = []

    def start(self) -> dict[str, Any]:
        here = current_job()
        span = {"attempt": here.attempt, "worker": here.worker_id, "start": time.monotonic()}
        with self._lock:
            self.spans.append(span)
        return span

    def assert_no_overlap(self) -> None:
        with self._lock:
            spans = sorted(self.spans, key=lambda s: s["start"])
        for before, after in itertools.pairwise(spans):
            assert "end" in before, spans
            assert after["start"] >= before["end"], f"attempts overlapped: {spans}"


def _watch_held(jq: JobQueue, job_id: int, span: dict[str, Any]) -> list[JobStatus]:
    """The job's status, sampled until its first attempt's code has returned."""
    seen: list[JobStatus] = []
    while "end" not in span:
        seen.append(job(jq, job_id).status)
        time.sleep(0.05)
    return seen


def _run_past_timeout(jq: JobQueue, task_name: str, attempts: Attempts) -> None:
    j = jq.enqueue(task_name, {})
    # Two workers with a free slot each: whichever does not hold the job
    # would take its retry at once if the timeout freed it early.
    with running(jq.worker(concurrency=1)), running(jq.worker(concurrency=1)):
        span = wait_for(lambda: attempts.spans and attempts.spans[0], what="the first attempt")
        # The start mark is written with the next batch of acks (within ~10 ms).
        wait_status(jq, [j.id], {JobStatus.RUNNING})
        seen = _watch_held(jq, j.id, span)
        done = wait_status(jq, [j.id], {JobStatus.COMPLETED})[0]
    assert seen and set(seen) == {JobStatus.RUNNING}, seen
    attempts.assert_no_overlap()
    assert [s["attempt"] for s in attempts.spans] == [1, 2]
    assert done.attempt == 2
    (error,) = error_texts(done)
    assert "JobTimeout" in error and "timeout of 0.5s" in error
    assert "past its timeout" in error  # recorded once the code had returned


def test_async_task_blocking_its_loop_past_the_timeout_never_overlaps_its_retry(make_queue):
    jq = make_queue()
    attempts = Attempts()

    @jq.task(timeout=0.5, max_attempts=3)
    async def blocks_loop() -> str:
        span = attempts.start()
        if current_job().attempt == 1:
            time.sleep(STUCK)  # blocks the event loop: no cancel can land meanwhile
        span["end"] = time.monotonic()
        return "done"

    _run_past_timeout(jq, "blocks_loop", attempts)


def test_sync_task_stuck_in_c_code_past_the_timeout_never_overlaps_its_retry(make_queue):
    jq = make_queue()
    attempts = Attempts()

    @jq.task(timeout=0.5, max_attempts=3)
    def sleeps_in_c() -> str:
        span = attempts.start()
        try:
            if current_job().attempt == 1:
                sleep_in_c(STUCK)  # the injected interrupt waits for this to return
        finally:
            span["end"] = time.monotonic()
        return "done"

    _run_past_timeout(jq, "sleeps_in_c", attempts)


def test_cancel_of_code_stuck_in_c_keeps_the_job_held_until_it_returns(make_queue):
    jq = make_queue()
    attempts = Attempts()

    @jq.task
    def sleeps_in_c() -> str:
        span = attempts.start()
        try:
            sleep_in_c(STUCK)
        finally:
            span["end"] = time.monotonic()
        return "done"

    j = sleeps_in_c.enqueue()
    with running(jq.worker(concurrency=1)) as one, running(jq.worker(concurrency=1)) as two:
        span = wait_for(lambda: attempts.spans and attempts.spans[0], what="the attempt")
        wait_status(jq, [j.id], {JobStatus.RUNNING})  # its start mark is written
        assert jq.cancel(j.id).status == JobStatus.RUNNING
        # Two heartbeat passes of each worker after the request: the holder's
        # cancel poll has seen it.
        for heartbeat in (one.worker.heartbeat, two.worker.heartbeat):
            assert heartbeat.wait_passes(heartbeat.loop_passes + 2, timeout=DEADLINE)
        refused = 0
        while "end" not in span:
            assert job(jq, j.id).status == JobStatus.RUNNING
            with pytest.raises(JobStateError, match="running"):
                jq.retry(j.id)
            refused += 1
            time.sleep(0.1)
        done = wait_status(jq, [j.id], {JobStatus.CANCELLED, JobStatus.COMPLETED})[0]
    assert refused > 0
    assert done.status == JobStatus.CANCELLED
    assert done.attempt == 1 and done.worker_id is None
    assert [s["attempt"] for s in attempts.spans] == [1]


def test_a_stop_leaves_code_that_does_not_return_held_not_released(make_queue):
    # Past the grace period the worker interrupts what still runs and waits a
    # little; code stuck in C does not return, so its job must stay held by
    # this worker (rescued after rescue_after once its heartbeat stops), not be
    # handed back for another worker to start beside it.
    jq = make_queue(shutdown_grace=0.2, rescue_after=60)
    returned = threading.Event()
    started = threading.Event()

    @jq.task
    def stuck() -> str:
        started.set()
        try:
            sleep_in_c(6)
        finally:
            returned.set()
        return "late"

    j = stuck.enqueue()
    worker = jq.worker(concurrency=1)
    with running(worker) as handle:
        assert started.wait(30)
        wait_status(jq, [j.id], {JobStatus.RUNNING})  # its start mark is written
        worker.stop()
        stats = handle.join()
    assert not returned.is_set(), "the test needs the code still running here"
    assert stats.exit_code == 1
    held = job(jq, j.id)
    assert held.status == JobStatus.RUNNING, held
    assert held.worker_id == worker.info.id and held.attempt == 1
    assert held.errors == []
    # The worker row stays, so a rescuer waits the full rescue_after.
    assert [w.id for w in jq.workers()] == [worker.info.id]
    assert returned.wait(30)
    time.sleep(0.3)
    # The late return writes nothing: the job waits for its rescue.
    after = job(jq, j.id)
    assert (after.status, after.worker_id, after.errors) == (JobStatus.RUNNING, worker.info.id, [])


def test_a_stop_counts_outcomes_a_blocking_listener_holds_as_held(make_queue, caplog):
    # Break-test: a FINISHED listener that blocks (a span exporter that does
    # not answer, a log handler on a full pipe) held an outcome that was
    # never written, while the stop said "interrupting 0 jobs" and "0 left
    # held". The job stays held (rescued later, no crash charged) and the
    # stop says why.
    jq = make_queue(shutdown_grace=0.2, rescue_after=60)
    unblock = threading.Event()
    finishing = threading.Event()

    def blocking(event: Any) -> None:
        finishing.set()
        unblock.wait(30)

    unsubscribe = jq.events.subscribe(blocking, [EventKind.FINISHED])
    try:

        @jq.task
        def quick() -> str:
            return "done"

        j = quick.enqueue()
        worker = jq.worker(concurrency=1)
        with caplog.at_level(logging.INFO, logger="jobkeeper"), running(worker) as handle:
            assert finishing.wait(30)
            worker.stop()
            stats = handle.join()
    finally:
        unblock.set()
        unsubscribe()
    assert stats.exit_code == 1
    held = job(jq, j.id)
    assert held.status in (JobStatus.CLAIMED, JobStatus.RUNNING), held
    assert held.worker_id == worker.info.id and held.errors == []
    assert held.crashes == 0
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "1 jobs returned, but their outcomes are still with the worker's event listeners" in (
        messages
    ), messages
    assert f"{j.id} (quick)" in messages
    assert "1 left held" in messages, messages


def test_an_outcome_a_listener_holds_is_named_while_the_worker_runs(
    make_queue, caplog, monkeypatch
):
    # Held past SLOW_DELIVERY, the job stays running under a live heartbeat
    # (no rescue overrides that): the worker says so, once, while it runs.
    from jobkeeper.worker import executor

    monkeypatch.setattr(executor, "SLOW_DELIVERY", 0.3)
    jq = make_queue()
    unblock = threading.Event()

    def blocking(event: Any) -> None:
        if event.job is not None and event.job.task == "stuck_outcome":
            unblock.wait(30)

    unsubscribe = jq.events.subscribe(blocking, [EventKind.FINISHED])
    try:

        @jq.task
        def stuck_outcome() -> None:
            return None

        j = stuck_outcome.enqueue()
        with caplog.at_level(logging.WARNING, logger="jobkeeper"), running(jq.worker()):
            said = wait_for(
                lambda: [
                    r.getMessage()
                    for r in caplog.records
                    if "still waits for the worker's event listeners" in r.getMessage()
                ],
                what="the warning",
            )
            assert len(said) == 1 and said[0].startswith(f"job {j.id} (stuck_outcome)")
            assert job(jq, j.id).status in (JobStatus.CLAIMED, JobStatus.RUNNING)
            unblock.set()
            wait_status(jq, [j.id], {JobStatus.COMPLETED})
    finally:
        unblock.set()
        unsubscribe()
