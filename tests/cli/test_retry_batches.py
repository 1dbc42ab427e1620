"""A filtered ``retry`` of jobs that are not dead letters, a batch per
statement (``job_retry_many``), on both backends.

One by one, two round trips a job, 50,000 retries took 33 s on PostgreSQL.
The batches keep the one-by-one rules: each job acted on once, only while
still in a selected status, a job whose unique_key a pending job holds (or
an earlier job of the filter took back) skipped and counted, fences and
errors kept, attempts reset.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from backends.helpers import claim, complete, fail
from jobkeeper import Job, JobQueue, JobStatus
from jobkeeper.errors import UniqueKeyConflict
from support.cli import Cli
from support.waiting import DEADLINE

SKIPPED = "that changed state meanwhile (or whose unique_key a pending job holds)"


def failed_once(jq: JobQueue, task: str, key: str | None = None, *, queue: str = "q") -> Job:
    """A job of ``task`` whose one attempt failed: retryable, due now."""
    job = jq.enqueue(task, {}, queue=queue, unique_key=key)
    (running,) = claim(jq, queue, limit=1)
    assert running.id == job.id
    assert fail(jq, running, "retryable") == {job.id}
    after = jq.get_job(job.id)
    assert after is not None and after.status == JobStatus.RETRYABLE
    return after


def cancelled(jq: JobQueue, task: str, key: str | None = None) -> Job:
    return jq.cancel(jq.enqueue(task, {}, queue="q", unique_key=key).id)


def record_statements(monkeypatch: pytest.MonkeyPatch, jq: JobQueue) -> list[list[int]]:
    """The ids of each ``job_retry_many`` call, and no ``JobQueue.retry`` allowed."""
    statements: list[list[int]] = []
    real = type(jq.backend).job_retry_many

    def counted(self: Any, *, job_ids: list[int], **kwargs: Any) -> list[int]:
        statements.append(list(job_ids))
        return real(self, job_ids=job_ids, **kwargs)

    def no_one_by_one(self: Any, job_id: int, **kwargs: Any) -> Job:
        raise AssertionError(f"job {job_id} retried one by one")

    monkeypatch.setattr(type(jq.backend), "job_retry_many", counted)
    monkeypatch.setattr(JobQueue, "retry", no_one_by_one)
    return statements


def test_a_filtered_retry_goes_a_batch_at_a_time(cli, queue, monkeypatch):
    monkeypatch.setattr("jobkeeper.cli.actions.BATCH", 2)
    jobs = [failed_once(queue, "mail") for _ in range(3)] + [cancelled(queue, "mail")]
    statements = record_statements(monkeypatch, queue)
    out = cli.ok("retry", "--task", "mail", "--yes")
    assert out.strip() == "retried 4 jobs", out
    # Retryable jobs (2 + 1), then the cancelled one: newest first.
    assert statements == [[jobs[2].id, jobs[1].id], [jobs[0].id], [jobs[3].id]]
    for job in jobs:
        after = queue.get_job(job.id)
        assert after.status == JobStatus.AVAILABLE and after.attempt == 0
        assert after.fence == job.fence and after.errors == job.errors
        assert not after.cancel_requested and after.finished_at is None

    # Completed jobs only when asked, then as the others.
    (running,) = claim(queue, "q", limit=1)
    assert complete(queue, running) == {running.id}
    out = cli.ok("retry", "--task", "mail", "--status", "completed", "--yes")
    assert out.strip() == "retried 1 job", out
    assert queue.get_job(running.id).status == JobStatus.AVAILABLE


def clashes(jq: JobQueue, task: str) -> dict[str, int]:
    """Jobs of ``task`` whose retries meet unique keys, by name."""
    made = {
        "older_twin": cancelled(jq, task, "twin").id,
        "newer_twin": cancelled(jq, task, "twin").id,  # listed first: it takes the key
        "held": cancelled(jq, task, "held").id,
        "holder": jq.enqueue(task, {}, queue="other", unique_key="held").id,  # not selected
        "finished_mine": cancelled(jq, task, "mine").id,
        "plain": cancelled(jq, task).id,
    }
    made["retryable_mine"] = failed_once(jq, task, "mine", queue="r").id  # holds "mine"
    return made


@pytest.mark.parametrize("batch", [1_000, 1])
def test_unique_key_clashes_in_a_batch_are_skipped_as_one_by_one(cli, queue, monkeypatch, batch):
    # The same jobs twice (two tasks): retried in batches, then one by one
    # (each batch statement refused by the unique index, as a concurrent
    # enqueue would make it, until the batch goes one by one). Same jobs
    # retried, same line.
    monkeypatch.setattr("jobkeeper.cli.actions.BATCH", batch)
    batched, single = clashes(queue, "batched"), clashes(queue, "single")
    retried = {"newer_twin", "plain", "retryable_mine"}
    line = f"retried 3 jobs; skipped 3 {SKIPPED}"

    with monkeypatch.context() as patch:
        statements = record_statements(patch, queue)
        assert cli.ok("retry", "--task", "batched", "--yes").strip() == line
    assert len(statements) == (2 if batch > 1 else 6)
    for name, job_id in batched.items():
        status = queue.get_job(job_id).status
        wanted = "available" if name in retried | {"holder"} else "cancelled"
        assert status == wanted, (name, status)

    refused: list[list[int]] = []

    def refuse(self: Any, *, job_ids: list[int], **kwargs: Any) -> list[int]:
        refused.append(job_ids)
        raise UniqueKeyConflict("refused")

    monkeypatch.setattr(type(queue.backend), "job_retry_many", refuse)
    assert cli.ok("retry", "--task", "single", "--yes").strip() == line
    from jobkeeper.cli.actions import LIVE_TRIES

    assert len(refused) == LIVE_TRIES * (2 if batch > 1 else 6)
    for name, job_id in single.items():
        assert queue.get_job(job_id).status == queue.get_job(batched[name]).status, name


def test_jobs_that_change_between_listing_and_retry(cli, queue, monkeypatch):
    # Listed, then before the first retry statement: one is cancelled (still
    # selected), one runs and completes, one is claimed, one runs and dies
    # (a dead letter now: dead letters are selected too), one is retried
    # and claimed elsewhere, and a pending job takes one's unique_key.
    still = failed_once(queue, "mail")
    completes = failed_once(queue, "mail")
    claimed = failed_once(queue, "mail")
    dies = failed_once(queue, "mail")
    taken = cancelled(queue, "mail", "k")
    elsewhere = cancelled(queue, "mail")
    listed = False
    real_retry = JobQueue.retry
    real_list = type(queue.backend).job_list_ids

    def run(job: Job, outcome: str | None) -> Job:
        # The scheduler makes the retryable jobs available; a worker claims
        # the oldest (this one), then ends it.
        queue.backend.job_stage_due(queues=["q"])
        (running,) = claim(queue, "q", limit=1)
        assert running.id == job.id
        if outcome == "completed":
            assert complete(queue, running) == {job.id}
        elif outcome is not None:
            assert fail(queue, running, outcome) == {job.id}
        return running

    def list_then_move(self: Any, **kwargs: Any) -> list[tuple[int, JobStatus]]:
        nonlocal listed
        page = real_list(self, **kwargs)
        if not listed:
            listed = True
            queue.cancel(still.id)
            for job, outcome in ((completes, "completed"), (claimed, None), (dies, "dead")):
                run(job, outcome)
            real_retry(queue, elsewhere.id)
            (held,) = claim(queue, "q", limit=1)
            assert held.id == elsewhere.id
            queue.enqueue("mail", {}, queue="q", unique_key="k")
        return page

    monkeypatch.setattr(type(queue.backend), "job_list_ids", list_then_move)
    statements = record_statements(monkeypatch, queue)
    requeued: list[list[int]] = []
    real_requeue = JobQueue.requeue_dead

    def requeue(self: Any, job_ids: list[int] | None = None) -> list[int]:
        requeued.append(list(job_ids or []))
        return real_requeue(self, job_ids)

    monkeypatch.setattr(JobQueue, "requeue_dead", requeue)
    out = cli.ok("retry", "--task", "mail", "--yes")
    assert out.strip() == f"retried 2 jobs; skipped 4 {SKIPPED}", out
    # One statement per status listed; the retryable jobs it left alone
    # are looked for among the dead letters (as one by one would find dies).
    assert statements == [
        [dies.id, claimed.id, completes.id, still.id],
        [elsewhere.id, taken.id],
    ]
    assert requeued == [[dies.id, claimed.id, completes.id], [elsewhere.id, taken.id]]
    after = {job.id: queue.get_job(job.id) for job in (still, completes, claimed, dies)}
    assert after[still.id].status == JobStatus.AVAILABLE
    assert after[still.id].attempt == 0 and after[still.id].fence == still.fence
    assert after[completes.id].status == JobStatus.COMPLETED  # not run again
    assert after[claimed.id].status == JobStatus.CLAIMED and after[claimed.id].attempt == 2
    assert after[dies.id].status == JobStatus.AVAILABLE and after[dies.id].attempt == 0
    assert queue.get_job(taken.id).status == JobStatus.CANCELLED
    assert queue.get_job(elsewhere.id).status == JobStatus.CLAIMED


def test_a_key_taken_while_the_statement_runs_refuses_it_and_the_next_skips_it(
    pg_url, capsys, monkeypatch
):
    # PostgreSQL: a holder of the key committed after the statement's
    # snapshot is met in the unique index only; the statement is refused
    # (nothing written) and the next one leaves the job out.
    cli = Cli.migrated(pg_url, capsys)
    with JobQueue(pg_url) as queue:
        plain = [cancelled(queue, "mail") for _ in range(3)]
        taken = cancelled(queue, "mail", "k")
        statements = record_statements(monkeypatch, queue)
        with psycopg.connect(pg_url) as holding:
            holder = queue.enqueue("mail", {}, queue="q", unique_key="k", connection=holding)
            pid = holding.info.backend_pid

            def commit_once_waited_for() -> None:
                # Once the retry statement waits on the uncommitted holder.
                with psycopg.connect(pg_url, autocommit=True) as watch:
                    ends = time.monotonic() + DEADLINE
                    while time.monotonic() < ends:
                        row = watch.execute(
                            "SELECT count(*) FROM pg_stat_activity"
                            " WHERE %s = ANY(pg_blocking_pids(pid))",
                            [pid],
                        ).fetchone()
                        if row and row[0]:
                            break
                        time.sleep(0.01)
                holding.commit()

            committer = threading.Thread(target=commit_once_waited_for)
            committer.start()
            try:
                out = cli.ok("retry", "--task", "mail", "--yes")
            finally:
                committer.join()
        assert out.strip() == f"retried 3 jobs; skipped 1 {SKIPPED}", out
        ids = [job.id for job in reversed([*plain, taken])]
        assert statements == [ids, ids]
        assert all(queue.get_job(job.id).status == JobStatus.AVAILABLE for job in plain)
        assert queue.get_job(taken.id).status == JobStatus.CANCELLED
        assert queue.get_job(holder.id).status == JobStatus.AVAILABLE


def test_job_retry_many_takes_the_newest_first(jq):
    # The backend operation alone: of two jobs taking one key back, the
    # newer, in whatever order job_ids has them (a filtered listing has the
    # newest first); dead letters and other statuses left out.
    first, second = (cancelled(jq, "mail", "k") for _ in range(2))
    other = jq.enqueue("mail", {}, queue="q")
    ids = [first.id, other.id, second.id, first.id]
    assert jq.backend.job_retry_many(job_ids=ids, statuses=["dead", "cancelled"]) == [second.id]
    assert jq.get_job(first.id).status == JobStatus.CANCELLED
    assert jq.backend.job_retry_many(job_ids=[first.id], statuses=["dead"]) == []
    assert jq.backend.job_retry_many(job_ids=[], statuses=["cancelled"]) == []
    assert jq.backend.job_retry_many(job_ids=[first.id]) == []  # second holds the key
    jq.cancel(second.id)
    assert jq.backend.job_retry_many(job_ids=[first.id]) == [first.id]
