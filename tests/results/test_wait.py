"""jq.wait / wait_async: every outcome, many waiters, cross-process wake-ups."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import processes
from jobkeeper import JobCancelled, JobFailed, JobNotFound, JobQueue, JobStatus
from jobkeeper.backends.postgres.waiters import done_channel
from jobkeeper.errors import ConfigError
from jobkeeper.waiting import RECHECK
from results.test_snooze_backoff_async import run_async
from support.db import sql
from support.waiting import wait_for, wait_status
from worker.helpers import running


def tasks(jq: JobQueue) -> dict[str, Any]:
    gate = threading.Event()

    @jq.task()
    def echo(value: Any) -> Any:
        return {"echo": value}

    @jq.task()
    def gated(value: int) -> int:
        gate.wait(30)
        return value

    @jq.task(max_attempts=2, backoff=lambda attempt, error: 0.0)
    def always_fails() -> None:
        raise RuntimeError("boom")

    @jq.task(max_attempts=5, backoff=lambda attempt, error: 0.2)
    def fails_twice() -> str:
        from jobkeeper import current_job

        if current_job().attempt <= 2:
            raise RuntimeError("not yet")
        return "third time"

    @jq.task()
    def long_sleep() -> None:
        for _ in range(600):
            time.sleep(0.05)

    return {"gate": gate, "echo": echo, "gated": gated, "always_fails": always_fails,
            "fails_twice": fails_twice, "long_sleep": long_sleep}  # fmt: skip


def test_wait_returns_result_of_a_job_finishing_later(jq: JobQueue) -> None:
    t = tasks(jq)
    job = t["gated"].enqueue(value=7)
    with running(jq.worker(concurrency=2)):
        wait_status(jq, [job.id], {JobStatus.RUNNING})
        threading.Timer(0.3, t["gate"].set).start()
        started = time.monotonic()
        assert jq.wait(job.id, timeout=20) == 7
        assert time.monotonic() - started < 10


def test_wait_on_a_completed_job_returns_at_once(jq: JobQueue) -> None:
    t = tasks(jq)
    job = t["echo"].enqueue(value=[1, "a"])
    with running(jq.worker(concurrency=2)):
        wait_status(jq, [job.id], {JobStatus.COMPLETED})
    assert jq.wait(job.id, timeout=5) == {"echo": [1, "a"]}


def test_wait_dead_job_raises_job_failed_with_errors(jq: JobQueue) -> None:
    t = tasks(jq)
    job = t["always_fails"].enqueue()
    with running(jq.worker(concurrency=2)), pytest.raises(JobFailed) as caught:
        jq.wait(job.id, timeout=20)
    assert caught.value.job.status == JobStatus.DEAD
    assert [e["attempt"] for e in caught.value.job.errors] == [1, 2]
    assert "boom" in str(caught.value.job.errors[-1]["error"])


def test_wait_follows_a_retrying_job_to_its_success(jq: JobQueue) -> None:
    t = tasks(jq)
    job = t["fails_twice"].enqueue()
    with running(jq.worker(concurrency=2)):
        assert jq.wait(job.id, timeout=20) == "third time"
    assert len(jq.get_job(job.id).errors) == 2  # type: ignore[union-attr]


def test_wait_cancelled_raises_public_job_cancelled(jq: JobQueue) -> None:
    t = tasks(jq)
    pending = t["echo"].enqueue(value=1)
    jq.cancel(pending.id)
    with pytest.raises(JobCancelled):
        jq.wait(pending.id, timeout=5)
    running_job = t["long_sleep"].enqueue()
    with running(jq.worker(concurrency=2)):
        wait_status(jq, [running_job.id], {JobStatus.RUNNING})
        threading.Timer(0.2, jq.cancel, args=(running_job.id,)).start()
        with pytest.raises(JobCancelled) as caught:
            jq.wait(running_job.id, timeout=20)
    assert caught.value.job.id == running_job.id
    assert caught.value.job.status == JobStatus.CANCELLED


def test_wait_unknown_job_raises_not_found(jq: JobQueue) -> None:
    with pytest.raises(JobNotFound):
        jq.wait(987654, timeout=5)


def test_wait_pruned_job_raises_not_found(make_queue: Any) -> None:
    jq = make_queue(retention=0)
    t = tasks(jq)
    job = t["gated"].enqueue(value=1)
    with running(jq.worker(concurrency=2)):
        wait_status(jq, [job.id], {JobStatus.RUNNING})
        threading.Timer(0.2, t["gate"].set).start()
        # Deleted at completion (retention=0): the waiter is woken by the
        # deletion and finds nothing to return.
        with pytest.raises(JobNotFound):
            jq.wait(job.id, timeout=20)


def test_wait_times_out_with_builtin_timeout_error(jq: JobQueue) -> None:
    t = tasks(jq)
    job = t["echo"].enqueue(value=1)  # no worker runs it
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        jq.wait(job.id, timeout=0.5)
    assert 0.45 <= time.monotonic() - started < 5


def test_wait_refuses_bad_timeout_and_id(jq: JobQueue) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        jq.wait(1, timeout=-1)
    with pytest.raises(ConfigError, match="timeout"):
        jq.wait(1, timeout=float("nan"))
    with pytest.raises(ConfigError, match="job id"):
        jq.wait(0)


def test_200_waiters_threads_and_asyncio_all_woken(jq: JobQueue) -> None:
    t = tasks(jq)
    jobs = jq.enqueue_many([("gated", {"value": i}) for i in range(200)])
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def waiter(job_id: int) -> None:
        try:
            results[job_id] = jq.wait(job_id, timeout=60)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=waiter, args=(j.id,)) for j in jobs[:100]]
    for thread in threads:
        thread.start()

    async def async_waiters() -> list[Any]:
        try:
            return await asyncio.gather(*(jq.wait_async(j.id, timeout=60) for j in jobs[100:]))
        finally:
            await jq.aclose()

    async_results: list[Any] = []
    loop_thread = threading.Thread(
        target=lambda: async_results.extend(asyncio.run(async_waiters()))
    )
    loop_thread.start()
    if jq.url.scheme == "postgresql":
        # Every waiter marks its job before it sleeps; then they all wait.
        wait_for(lambda: sql(jq, "SELECT count(*) FROM jobkeeper_jobs WHERE awaited")[0][0] == 200)
        # One listening connection for all 200 waiters of this process.
        schema = sql(jq, "SELECT current_schema()")[0][0]
        listen = f'LISTEN "{done_channel(schema)}"'
        listeners = sql(jq, "SELECT count(*) FROM pg_stat_activity WHERE query = ?", (listen,))
        assert listeners[0][0] == 1
    with running(jq.worker(concurrency=50)):
        time.sleep(0.2)  # waiters settle into their sleep (not a synchronisation)
        t["gate"].set()
        opened = time.monotonic()
        for thread in threads:
            thread.join(60)
        loop_thread.join(60)
        # Woken by the ends themselves, not by the waiters' 30 s backstop re-read.
        assert time.monotonic() - opened < RECHECK / 3
    assert not errors
    assert [results[j.id] for j in jobs[:100]] == list(range(100))
    assert async_results == list(range(100, 200))


def test_wait_async_outcomes(jq: JobQueue) -> None:
    t = tasks(jq)
    ok = t["echo"].enqueue(value="x")
    dead = t["always_fails"].enqueue()

    async def main() -> None:
        try:
            assert await jq.wait_async(ok.id, timeout=20) == {"echo": "x"}
            with pytest.raises(JobFailed):
                await jq.wait_async(dead.id, timeout=20)
            with pytest.raises(JobNotFound):
                await jq.wait_async(999999, timeout=5)
            with pytest.raises(TimeoutError):
                late = await jq.enqueue_async("echo", {"value": 1}, delay=3600)
                await jq.wait_async(late.id, timeout=0.3)
        finally:
            await jq.aclose()

    with running(jq.worker(concurrency=2)):
        run_async(main())


def test_wait_is_woken_by_a_worker_in_another_process(db_url: str, tmp_path: Path) -> None:
    jq = JobQueue(db_url, poll_interval=0.05)
    jq.migrate()
    try:
        job = jq.enqueue("echo", {"value": 5, "seconds": 0.5})
        settings = {"poll_interval": 0.05}
        argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker",
                "--app", "tests.results.app:jq", "--concurrency", "2"]  # fmt: skip
        with processes(tmp_path) as procs:
            procs.spawn(argv, settings=settings, name="worker")
            assert jq.wait(job.id, timeout=30) == {"echo": 5}
            dead = jq.enqueue("always_fails")
            with pytest.raises(JobFailed):
                jq.wait(dead.id, timeout=30)
    finally:
        jq.close()


class _FlakyBackend:
    """A backend whose reads fail twice (the server restarting), then work."""

    def __init__(self, backend, failures: int = 2):
        self._backend = backend
        self.failures = failures

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def job_get(self, *, job_id):
        from jobkeeper import DatabaseUnavailable

        if self.failures:
            self.failures -= 1
            raise DatabaseUnavailable("the server is restarting")
        return self._backend.job_get(job_id=job_id)


def test_wait_waits_out_a_database_that_is_down_for_a_moment(jq):
    from jobkeeper.api.results import _drive_wait

    j = jq.enqueue("t", {})
    flaky = _FlakyBackend(jq.backend)
    # Not done yet: the two failed reads are waited out, then the timeout applies.
    with pytest.raises(TimeoutError):
        _drive_wait(flaky, j.id, 0.5, 0.05)
    assert flaky.failures == 0


def test_wait_raises_the_outage_once_its_timeout_is_spent(jq):
    from jobkeeper import DatabaseUnavailable
    from jobkeeper.api.results import _drive_wait

    j = jq.enqueue("t", {})
    with pytest.raises(DatabaseUnavailable):
        _drive_wait(_FlakyBackend(jq.backend, failures=10**6), j.id, 0.3, 0.05)
