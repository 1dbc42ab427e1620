"""In-process worker: the retry policy, backoff and dead letters (the
huge backoff and unstorable error text of cases C-06 and C-09 are in
tests/cases).
"""

from __future__ import annotations

from jobkeeper import Discard, JobStatus, Retry
from jobkeeper.backoff import ABSOLUTE_MAX_BACKOFF, backoff_ceiling
from support.db import job, now_sql, sql
from support.waiting import wait_status

from .helpers import error_texts, running, running_count


def _make_due(jq, job_ids) -> None:
    """Test hook for the backoff clock: make retryable jobs due now."""
    marks = ",".join("?" * len(job_ids))
    sql(
        jq,
        f"UPDATE jobkeeper_jobs SET scheduled_at = {now_sql(jq)} "
        f"WHERE status = 'retryable' AND id IN ({marks})",
        list(job_ids),
    )


def test_retry_discard_and_exceptions_follow_the_policy(make_queue):
    jq = make_queue()
    calls: dict[str, int] = {}

    def count(name: str) -> int:
        calls[name] = calls.get(name, 0) + 1
        return calls[name]

    @jq.task(max_attempts=5)
    def retry_then_ok() -> str:
        if count("retry") < 3:
            raise Retry(delay=0, reason="not yet")
        return "ok"

    @jq.task(max_attempts=5)
    def discard() -> None:
        count("discard")
        raise Discard("bad input, never retry")

    @jq.task(max_attempts=3)
    def boom() -> None:
        count("boom")
        raise ValueError("kaboom")

    @jq.task(max_attempts=2)
    def exits() -> None:
        count("exits")
        raise SystemExit(3)  # must not stop the worker

    @jq.task(max_attempts=2)
    async def async_boom() -> None:
        count("async_boom")
        raise RuntimeError("async kaboom")

    r, d, b, e, a = (t.enqueue() for t in (retry_then_ok, discard, boom, exits, async_boom))
    with running(jq.worker(concurrency=5)):
        wait_status(jq, [r.id], {JobStatus.COMPLETED})
        wait_status(jq, [d.id, b.id, e.id, a.id], {JobStatus.DEAD})

    done = job(jq, r.id)
    assert done.result == "ok" and done.attempt == 3
    assert [x["attempt"] for x in done.errors] == [1, 2]
    assert all("not yet" in x["error"] for x in done.errors)
    assert all(x["traceback"] is None for x in done.errors)

    discarded = job(jq, d.id)
    assert calls["discard"] == 1 and discarded.attempt == 1
    assert "never retry" in (discarded.dead_reason or "")
    assert "never retry" in discarded.errors[0]["error"]

    boomed = job(jq, b.id)
    assert calls["boom"] == 3 and boomed.attempt == 3
    assert [x["attempt"] for x in boomed.errors] == [1, 2, 3]
    for entry in boomed.errors:
        assert set(entry) >= {"attempt", "at", "error", "traceback"}
        assert entry["error"] == "ValueError: kaboom"
        assert "Traceback" in entry["traceback"] and "kaboom" in entry["traceback"]
        assert isinstance(entry["at"], str) and entry["at"]
    assert "max_attempts=3" in (boomed.dead_reason or "")

    assert calls["exits"] == 2 and "SystemExit" in job(jq, e.id).errors[0]["error"]
    assert calls["async_boom"] == 2
    assert error_texts(job(jq, a.id)) == ["RuntimeError: async kaboom"] * 2
    assert running_count(jq) == 0


def test_retry_delay_is_honoured(make_queue):
    jq = make_queue()

    @jq.task(max_attempts=3)
    def later() -> None:
        raise Retry(delay=3600, reason="come back in an hour")

    j = later.enqueue()
    jq.run_worker(burst=True)  # the retry is not due: burst mode stops
    after = job(jq, j.id)
    assert after.status == JobStatus.RETRYABLE
    assert after.attempt == 1
    assert after.finished_at is not None
    wait = (after.scheduled_at - after.finished_at).total_seconds()
    assert 3600 - 1 <= wait <= 3600 + 1


def test_backoff_ceiling_grows_with_the_attempt(make_queue):
    # base 10, cap 500 s: ceilings 10, 100, 500, 500. Each retry's delay
    # (scheduled_at - finished_at, both on the database clock) must lie in
    # [0, ceiling(attempt)]; over 20 jobs the largest delay at attempt 2 must
    # exceed attempt 1's ceiling (all 20 below it has probability 1e-20).
    jq = make_queue(backoff_base=10, max_backoff=500)

    @jq.task(max_attempts=5)
    def always_fails(i: int) -> None:
        raise RuntimeError(f"fail {i}")

    ids = [j.id for j in jq.enqueue_many([("always_fails", {"i": i}) for i in range(20)])]
    delays: dict[int, list[float]] = {1: [], 2: [], 3: [], 4: []}
    for _ in range(8):
        jq.run_worker(concurrency=10, burst=True)
        # Burst mode also runs retries due within the poll interval, so a
        # job may be past the round's attempt: file each delay under the
        # attempt that set it.
        pending = []
        for job_id in ids:
            j = job(jq, job_id)
            if j.status == JobStatus.DEAD:
                continue
            assert j.status == JobStatus.RETRYABLE and j.finished_at is not None
            ceiling = backoff_ceiling(j.attempt, base=10, max_backoff=500)
            delay = (j.scheduled_at - j.finished_at).total_seconds()
            assert -0.001 <= delay <= ceiling + 0.001, (j.attempt, delay, ceiling)
            delays[j.attempt].append(delay)
            pending.append(job_id)
        if not pending:
            break
        _make_due(jq, pending)
    assert max(delays[2]) > backoff_ceiling(1, base=10, max_backoff=500)
    assert max(delays[3]) > backoff_ceiling(2, base=10, max_backoff=500)
    # Jitter: the delays are spread, not one value.
    assert len({round(d, 3) for d in delays[4]}) > 10
    for job_id in ids:
        dead = job(jq, job_id)
        assert dead.status == JobStatus.DEAD
        assert [e["attempt"] for e in dead.errors] == [1, 2, 3, 4, 5]


def test_dead_letters_keep_every_error_and_requeue_brings_them_back(make_queue):
    jq = make_queue()
    healthy = {"yes": False}

    @jq.task(max_attempts=3)
    def flaky(n: int) -> int:
        if not healthy["yes"]:
            raise ConnectionError(f"upstream down for {n}")
        return n

    ids = [j.id for j in jq.enqueue_many([("flaky", {"n": n}) for n in range(3)])]
    with running(jq.worker(concurrency=3)):
        dead = wait_status(jq, ids, {JobStatus.DEAD})
    for d in dead:
        assert d.attempt == 3
        assert [e["attempt"] for e in d.errors] == [1, 2, 3]
        assert all("upstream down" in text for text in error_texts(d))
    assert {j.id for j in jq.list_jobs(status="dead")} == set(ids)
    assert jq.stats()["default"]["dead"] == 3

    healthy["yes"] = True
    assert jq.requeue_dead([ids[0]]) == [ids[0]]
    back = job(jq, ids[0])
    assert back.status == JobStatus.AVAILABLE and back.attempt == 0
    assert len(back.errors) == 3  # history kept
    revived = jq.retry(ids[1])  # retry() also takes a dead job
    assert revived.status == JobStatus.AVAILABLE
    jq.run_worker(burst=True)
    for job_id in ids[:2]:
        done = job(jq, job_id)
        assert done.status == JobStatus.COMPLETED
        assert done.attempt == 1
        assert len(done.errors) == 3
    assert job(jq, ids[2]).status == JobStatus.DEAD


def test_retry_with_an_unstorable_delay_is_capped_not_stuck(make_queue):
    # Retry(delay=1e12) is ~31,700 years: past what PostgreSQL stores. The
    # delay is capped at the backoff's absolute maximum, the failure is
    # written, and the worker goes on with the next job.
    jq = make_queue()

    @jq.task(max_attempts=3)
    def far() -> None:
        raise Retry(delay=1e12)

    @jq.task
    def after() -> int:
        return 1

    far_job = far.enqueue()
    others = [after.enqueue() for _ in range(3)]
    with running(jq.worker(concurrency=2)):
        wait_status(jq, [far_job.id], {JobStatus.RETRYABLE})
        wait_status(jq, [j.id for j in others], {JobStatus.COMPLETED})
    stored = job(jq, far_job.id)
    assert stored.finished_at is not None
    wait = (stored.scheduled_at - stored.finished_at).total_seconds()
    assert ABSOLUTE_MAX_BACKOFF * 0.99 < wait <= ABSOLUTE_MAX_BACKOFF + 1
    assert running_count(jq) == 0


def test_outcomes_survive_a_passing_database_error(make_queue):
    # A write that fails for a reason that passes (read-only, disk full: any
    # DatabaseError that is not about the data) is kept and written later;
    # the writer thread must not die and leave jobs running forever.
    from jobkeeper import DatabaseError

    jq = make_queue()

    @jq.task
    def work(n: int) -> int:
        return n

    jobs = [work.enqueue(n=n) for n in range(5)]
    worker = jq.worker(concurrency=5)
    backend = worker.completer._backend
    real = backend.job_complete_many
    failures = {"left": 3}

    def flaky(*, completions, delete):
        if failures["left"]:
            failures["left"] -= 1
            raise DatabaseError("SQLite error: database is read-only for a moment")
        return real(completions=completions, delete=delete)

    backend.job_complete_many = flaky
    with running(worker):
        final = wait_status(jq, [j.id for j in jobs], {JobStatus.COMPLETED})
    assert failures["left"] == 0
    assert sorted(j.result for j in final) == [0, 1, 2, 3, 4]
    assert worker.completer._thread.is_alive() is False  # stopped, not crashed
    assert running_count(jq) == 0
