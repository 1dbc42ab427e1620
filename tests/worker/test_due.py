"""In-process worker: jobs that come due start when due, not at the next poll.

Every test runs with ``poll_interval=5``: a start found by polling alone would
be seconds late, while a worker that wakes for what it knows is due starts
the job within a fraction of a second. Lateness is measured by the database
(``attempted_at - scheduled_at``), never by sleeping on the host.
"""

from __future__ import annotations

import subprocess
import sys
import time

from jobkeeper import Job, JobStatus, Retry
from support.db import now_sql, sql
from support.waiting import DEADLINE, wait_for, wait_status

from .helpers import running

#: A poll-based start would be seconds late; a prompt one is under this,
#: with room for two busy cores.
PROMPT = 1.0
SLOW_POLL = 5.0
ENQUEUE_DELAYED = ["enqueue", "noop", "--delay", "1"]


def _lateness(j: Job) -> float:
    """Seconds between when the job was due and when its last attempt started."""
    assert j.attempted_at is not None
    return (j.attempted_at - j.scheduled_at).total_seconds()


def _idle(jq, worker) -> None:
    """Wait until ``worker`` registered and went idle (its first staging done)."""
    wait_for(lambda: any(w.id == worker.info.id for w in jq.workers()), what="worker registered")
    time.sleep(0.3)


def test_a_delayed_job_enqueued_before_the_worker_starts_runs_when_due(make_queue):
    jq = make_queue(poll_interval=SLOW_POLL)

    @jq.task()
    def noop() -> None:
        pass

    job = noop.options(delay=1.5).enqueue()
    with running(jq.worker(concurrency=2)):
        (done,) = wait_status(jq, [job.id], {JobStatus.COMPLETED})
    assert 0 <= _lateness(done) < PROMPT, _lateness(done)


def test_a_delayed_job_enqueued_in_process_while_the_worker_idles_runs_when_due(make_queue):
    jq = make_queue(poll_interval=SLOW_POLL)

    @jq.task()
    def noop() -> None:
        pass

    worker = jq.worker(concurrency=2)
    with running(worker):
        _idle(jq, worker)
        job = noop.options(delay=1).enqueue()
        (done,) = wait_status(jq, [job.id], {JobStatus.COMPLETED})
    assert 0 <= _lateness(done) < PROMPT, _lateness(done)


def test_a_retry_with_a_delay_runs_when_due(make_queue):
    jq = make_queue(poll_interval=SLOW_POLL)
    calls: list[int] = []

    @jq.task(max_attempts=3)
    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise Retry(delay=1)

    with running(jq.worker(concurrency=2)):
        job = flaky.enqueue()
        (done,) = wait_status(jq, [job.id], {JobStatus.COMPLETED})
    assert done.attempt == 2
    assert 0 <= _lateness(done) < PROMPT, _lateness(done)


def test_a_delayed_job_enqueued_by_another_process_runs_promptly(make_queue):
    """Another process's enqueue comes with no in-process signal: the worker
    learns of it from the database (NOTIFY; SQLite's data_version), and at
    worst from the poll_interval fallback.
    """
    jq = make_queue(poll_interval=SLOW_POLL)

    @jq.task()
    def noop() -> None:
        pass

    worker = jq.worker(concurrency=2)
    with running(worker):
        _idle(jq, worker)
        out = subprocess.run(
            [sys.executable, "-m", "jobkeeper", "--database", jq.url.url, *ENQUEUE_DELAYED],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            check=True,
        )
        job_id = int(out.stdout.strip())
        (done,) = wait_status(jq, [job_id], {JobStatus.COMPLETED})
    assert 0 <= _lateness(done) <= SLOW_POLL, _lateness(done)  # the fallback
    assert _lateness(done) < PROMPT, _lateness(done)  # the wake-up


def test_staging_tells_when_the_next_job_of_the_queues_is_due(make_queue):
    jq = make_queue()
    jq.enqueue("t", {}, queue="a", delay=30)
    jq.enqueue("t", {}, queue="b", delay=10)
    due = jq.enqueue("t", {}, queue="a", delay=60)
    # Due now: staged, not "next".
    sql(jq, f"UPDATE jobkeeper_jobs SET scheduled_at = {now_sql(jq)} WHERE id = ?", [due.id])

    staging = jq.backend.job_stage_due(queues=["a"])
    assert staging.staged == 1
    assert staging.next_due_in is not None and 25 < staging.next_due_in <= 30
    staging = jq.backend.job_stage_due(queues=["a", "b"])
    assert staging.staged == 0
    assert staging.next_due_in is not None and 5 < staging.next_due_in <= 10
    assert jq.backend.job_stage_due(queues=["c"]).next_due_in is None
    assert jq.backend.job_stage_due().next_due_in is None  # no queues: no answer


def test_an_idle_worker_does_not_spin_on_jobs_another_worker_staged(make_queue):
    """A wake for a due job another worker already staged (and ran) finds
    nothing to stage and no sooner due time: the worker goes back to waiting
    for the next due job or the poll, not round the loop. (On SQLite, other
    connections' commits -- here the heartbeats, one a second per worker --
    prompt a staging each, at most ten a second; a spin would be thousands.)
    """
    jq = make_queue(poll_interval=SLOW_POLL, heartbeat_interval=1.0, rescue_after=10.0)

    @jq.task()
    def noop() -> None:
        pass

    first, second = jq.worker(concurrency=1), jq.worker(concurrency=1)
    stagings: list[float] = []
    stage = second._backend.job_stage_due

    def counted(**kwargs):
        stagings.append(time.monotonic())
        return stage(**kwargs)

    second._backend.job_stage_due = counted
    with running(first), running(second):
        _idle(jq, first)
        jobs = [noop.options(delay=0.5).enqueue() for _ in range(5)]
        wait_status(jq, [j.id for j in jobs], {JobStatus.COMPLETED})
        before = len(stagings)
        time.sleep(1.5)
        assert len(stagings) - before <= 6, stagings
