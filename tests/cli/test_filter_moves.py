"""``cancel`` and ``retry`` by filter while jobs move between statuses, on
both backends.

Break-test: ``cancel --task X --yes`` on 300 jobs being retried by a worker
printed "cancelled 298 jobs; asked the workers of 18 jobs" (316) and left
one job ``retryable`` without a cancel request: the ids were read one
status at a time, so a job that moved between two of those reads was listed
twice, or not at all. The moves are made here between the command's reads
and its actions (after the read that lists the first job), deterministically.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from backends.helpers import claim, complete, fail, kill
from jobkeeper import Job, JobQueue, JobStatus
from jobkeeper.errors import ConfigError, JobStateError


def retryable(jq: JobQueue, n: int) -> Job:
    """A job of task ``mail`` in queue ``q`` whose one attempt failed: retryable, due now."""
    job = jq.enqueue("mail", {"n": n}, queue="q")
    (running,) = claim(jq, "q", limit=1)
    assert running.id == job.id
    assert fail(jq, running, "retryable") == {job.id}
    after = jq.get_job(job.id)
    assert after is not None and after.status == JobStatus.RETRYABLE
    return after


def move_after_listing(
    monkeypatch: pytest.MonkeyPatch, jq: JobQueue, listed: int, move: Callable[[], None]
) -> list[str]:
    """Run ``move`` once, right after the first read of the command's backend
    that lists job ``listed``; returns the names of the reads seen.
    """
    backend_class = type(jq.backend)
    real = backend_class._fetch
    reads: list[str] = []
    moved = False

    def fetch(self: Any, name: str, params: Any = None, **kwargs: Any) -> Any:
        nonlocal moved
        rows = real(self, name, params, **kwargs)
        if self is not jq.backend and name.startswith("job_list"):
            reads.append(name)
            if not moved and any(row.get("id") == listed for row in rows):
                moved = True
                move()
        return rows

    monkeypatch.setattr(backend_class, "_fetch", fetch)
    return reads


def test_cancel_by_filter_acts_once_on_each_job_that_moves_between_statuses(
    cli, queue, monkeypatch
):
    waiting = retryable(queue, 0)
    pending = queue.enqueue("mail", {"n": 1}, queue="q")

    def move() -> None:
        # The worker claims the pending job; the scheduler makes the
        # retryable one available: both match the filter throughout.
        (held,) = claim(queue, "q", limit=1)
        assert held.id == pending.id
        queue.backend.job_stage_due(queues=["q"])
        assert queue.get_job(waiting.id).status == JobStatus.AVAILABLE

    move_after_listing(monkeypatch, queue, pending.id, move)
    out = cli.ok("cancel", "--task", "mail", "--yes")
    assert "cancelled 1 job; asked the workers of 1 job to stop them" in out, out
    after = queue.get_job(waiting.id)
    assert after.status == JobStatus.CANCELLED and after.cancel_requested
    held = queue.get_job(pending.id)
    assert held.status == JobStatus.CLAIMED and held.cancel_requested


def test_retry_by_filter_acts_once_and_leaves_a_job_that_completed_meanwhile(
    cli, queue, monkeypatch
):
    moves = retryable(queue, 0)
    finishes = retryable(queue, 1)

    def move() -> None:
        # One is cancelled (still matched: retryable, then cancelled); the
        # other runs again and completes (it no longer matches).
        queue.cancel(moves.id)
        queue.backend.job_stage_due(queues=["q"])
        (running,) = claim(queue, "q", limit=1)
        assert running.id == finishes.id
        assert complete(queue, running) == {finishes.id}

    move_after_listing(monkeypatch, queue, max(moves.id, finishes.id), move)
    out = cli.ok("retry", "--task", "mail", "--yes")
    assert "retried 1 job; skipped 1 that changed state meanwhile" in out, out
    assert queue.get_job(moves.id).status == JobStatus.AVAILABLE
    # Not run again: it left the filter (dead/retryable/cancelled) by completing.
    assert queue.get_job(finishes.id).status == JobStatus.COMPLETED


def test_retry_by_filter_pages_through_jobs_and_dead_letters_once_each(cli, queue, monkeypatch):
    # Pages of 2 ids over live jobs and dead letters, interleaved by id.
    monkeypatch.setattr("jobkeeper.cli.actions.PAGE", 2)
    made = [retryable(queue, n) for n in range(3)]
    dead = [kill(queue, queue.enqueue("mail", {"n": n}, queue="q")) for n in range(3, 5)]
    cancelled = queue.cancel(queue.enqueue("mail", {"n": 5}, queue="q").id)
    reads = move_after_listing(monkeypatch, queue, -1, lambda: None)
    out = cli.ok("retry", "--task", "mail", "--yes")
    assert "retried 6 jobs" in out and "skipped" not in out, out
    assert reads == ["job_list_ids"] * 4
    for job in (*made, *dead, cancelled):
        assert queue.get_job(job.id).status == JobStatus.AVAILABLE


def test_retry_if_status_takes_several_statuses(queue):
    job = retryable(queue, 0)
    with pytest.raises(JobStateError, match="changed meanwhile"):
        queue.retry(job.id, if_status=["dead", JobStatus.CANCELLED])
    with pytest.raises(ConfigError, match="at least one"):
        queue.retry(job.id, if_status=[])
    with pytest.raises(ConfigError, match="must be a job status"):
        queue.retry(job.id, if_status=["retryable", "nope"])
    # A status no retry applies to is never passed on, whatever if_status names.
    assert queue.retry(job.id, if_status=("running", "retryable")).status == JobStatus.AVAILABLE
