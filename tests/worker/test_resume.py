"""A worker that comes back from a silent spell (a pause, a starved process):
it judges nobody until it has beaten again for a window, it stops attempts
whose claim was rescued meanwhile, and code that swallowed a cancel ends
cancelled.
"""

from __future__ import annotations

import threading
import time

from jobkeeper import JobStatus
from jobkeeper.maintenance.heartbeat import Heartbeat
from jobkeeper.maintenance.rescuer import Rescuer
from support.waiting import wait_for, wait_status

from .helpers import holder_info, running


class _Beats:
    """A stand-in backend for the heartbeat: every write is acknowledged."""

    def worker_heartbeat(self, *, worker):
        return None

    def job_cancel_requested(self, *, worker_id):
        return []

    def job_held_by(self, *, worker_id):
        return []


def test_a_heartbeat_silent_for_two_intervals_judges_nobody(jq):
    # A process paused while holding SQLite's write lock stalls every other
    # worker's heartbeat; once it resumes, their silence is its own doing.
    worker = jq.worker()
    beat = Heartbeat(_Beats(), worker.info, 0.5, lambda claim: None, stale_after=2.0)
    beat.run_once()
    assert not beat.troubled_within(60)
    beat._last_beat = time.monotonic() - 5.0  # no beat for 5 s: a pause
    assert beat.troubled_within(60), "silent beats must count as trouble"
    beat.run_once()  # the first beat after the pause
    assert beat.troubled_within(60), "the window after a pause must count too"
    assert not beat.troubled_within(0.0)


def test_a_resumed_worker_stops_an_attempt_whose_claim_was_rescued(jq):
    started, stopped = threading.Event(), threading.Event()
    release = threading.Event()

    @jq.task(max_attempts=5)
    def long_job() -> str:
        started.set()
        try:
            while not release.is_set():
                time.sleep(0.02)  # interruptible: Python code between sleeps
        except BaseException:
            stopped.set()
            raise
        return "done"

    j = long_job.enqueue()
    worker = jq.worker(concurrency=1)
    with running(worker):
        assert started.wait(30)
        wait_status(jq, [j.id], {JobStatus.RUNNING})
        worker.heartbeat.paused = True  # silent, as if paused
        rescuer = Rescuer(jq.backend, jq.settings, 0.1)
        wait_for(
            lambda: rescuer.run_once() is None and jq.get_job(j.id).status != JobStatus.RUNNING,
            what="the silent worker's job to be rescued",
        )
        assert not stopped.is_set()
        worker.heartbeat.paused = False  # back: its next beat ends the stale spell
        assert stopped.wait(30), "the rescued attempt kept running beside its retry"
        release.set()
    assert worker.stats.lost_claims >= 1, "the stopped attempt's hand-back must be refused"


def test_code_that_swallows_a_cancel_and_returns_ends_cancelled(jq):
    started, caught = threading.Event(), threading.Event()

    @jq.task
    def swallows() -> str:
        started.set()
        try:
            for _ in range(3000):
                time.sleep(0.01)
        except BaseException:
            caught.set()
        return "carried on"

    j = swallows.enqueue()
    with running(jq.worker(concurrency=1)):
        assert started.wait(30)
        wait_status(jq, [j.id], {JobStatus.RUNNING})
        jq.cancel(j.id)
        (done,) = wait_status(jq, [j.id], {JobStatus.CANCELLED, JobStatus.COMPLETED})
    assert caught.is_set()
    assert done.status == JobStatus.CANCELLED, done


class _HoldsRead(_Beats):
    """The heartbeat's backend, answering ``job_held_by`` from a list."""

    def __init__(self, answers: list[list[str]]) -> None:
        self.answers = answers
        self.reads = 0

    def job_held_by(self, *, worker_id):
        self.reads += 1
        return self.answers.pop(0) if self.answers else []


def test_the_holds_are_read_again_a_beat_after_a_stale_spell():
    # A rescue that judged the worker silent may still be committing when
    # the spell's beat reads the holds: the plain read sees the job as still
    # held, and the rescued attempt ran on until its end. The next beat reads
    # again and sees the rescue.
    seen: list[list[str]] = []
    backend = _HoldsRead([["job 1"], []])
    beat = Heartbeat(
        backend,
        holder_info("w:1:aaaa"),
        0.5,
        lambda claim: None,
        stale_after=2.0,
        on_holds=lambda held, spells: seen.append(held),
    )
    beat.run_once()
    assert backend.reads == 0  # no spell, no read
    beat._last_beat = time.monotonic() - 5.0  # a pause
    beat.run_once()  # ends the spell
    beat.run_once()  # the beat after
    beat.run_once()
    assert seen == [["job 1"], []]
    assert backend.reads == 2


def test_an_attempt_claimed_after_the_spell_is_not_judged_by_the_holds_read(jq):
    # Break-test 15: the holds read after a spell can predate the commit of
    # a claim the worker makes right after the spell; four such attempts,
    # held all along, were asked to stop a few milliseconds in and ran again.
    started, release = threading.Event(), threading.Event()

    @jq.task
    def waits() -> str:
        started.set()
        assert release.wait(30)
        return "done"

    j = waits.enqueue()
    worker = jq.worker(concurrency=1)
    with running(worker):
        assert started.wait(30)
        wait_status(jq, [j.id], {JobStatus.RUNNING})
        _, spells = worker.heartbeat.liveness()
        # A read that missed the claim, for a spell that ended before it.
        worker._on_holds([], spells)
        assert worker.stats.lost_claims == 0
        release.set()
        (done,) = wait_status(jq, [j.id], {JobStatus.COMPLETED, JobStatus.AVAILABLE})
    assert done.status == JobStatus.COMPLETED and done.errors == [], done
