"""jobkeeper.testing: the pytest plugin's fixtures, drain, assert_enqueued and
run_task, on both backends (the plugin is loaded through its entry point)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobkeeper import Discard, JobQueue, PayloadError, Retry, current_job
from jobkeeper.pytest_plugin import schema_url
from jobkeeper.testing import (
    DrainError,
    assert_enqueued,
    drain,
    job_context,
    refute_enqueued,
    run_task,
)

PG_URL = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def test_drain_runs_due_jobs_and_their_follow_ups(jq: JobQueue) -> None:
    seen: list[tuple[str, int]] = []

    @jq.task()
    def child(n: int) -> int:
        seen.append(("child", n))
        return n * 2

    @jq.task(queue="other")
    def parent(n: int) -> str:
        seen.append(("parent", current_job().attempt))
        child.enqueue(n=n)
        return "ok"

    job = parent.enqueue(n=21)
    outcomes = drain(jq)
    assert outcomes == {"completed": 2}
    assert seen == [("parent", 1), ("child", 21)]
    assert jq.get_job(job.id).status == "completed"
    (done,) = jq.list_jobs(status="completed", task="child")
    assert done.result == 42


def test_drain_leaves_delayed_and_retrying_jobs_unless_asked(jq: JobQueue) -> None:
    calls: list[int] = []

    @jq.task(max_attempts=3)
    def flaky() -> None:
        calls.append(current_job().attempt)
        raise Retry(delay=3600)

    @jq.task()
    def later() -> str:
        return "ran"

    failing = flaky.enqueue()
    delayed = later.options(delay=3600).enqueue()
    assert drain(jq) == {"retryable": 1}
    assert calls == [1]
    assert jq.get_job(failing.id).status == "retryable"
    assert jq.get_job(delayed.id).status == "scheduled"

    outcomes = drain(jq, include_scheduled=True)
    assert outcomes == {"retryable": 1, "dead": 1, "completed": 1}
    # Plain str keys, as documented: FailureKind members compared equal
    # but printed (and showed in pytest's diffs) as <FailureKind.DEAD: 'dead'>.
    assert all(type(key) is str for key in outcomes), outcomes
    assert "FailureKind" not in repr(outcomes)
    assert calls == [1, 2, 3]
    assert jq.get_job(failing.id).status == "dead"
    assert jq.get_job(delayed.id).result == "ran"
    # Nothing is left to do: a second drain runs nothing.
    assert drain(jq, include_scheduled=True) == {}


def test_drain_leaves_a_retry_that_comes_due_while_it_runs(jq: JobQueue) -> None:
    # Full jitter can pick a backoff of a few milliseconds; the drain's worker
    # then staged the retry and ran the next attempt in the same drain (the
    # docs' worked example saw {"retryable": 2} about once in hundreds of runs).
    calls: list[int] = []

    @jq.task(max_attempts=10)
    def flaky() -> None:
        calls.append(current_job().attempt)
        raise Retry(delay=0.002)

    for round_ in range(1, 6):
        job = flaky.enqueue()
        assert drain(jq) == {"retryable": 1}, round_
        assert jq.get_job(job.id).attempt == 1
        jq.cancel(job.id)
    assert calls == [1] * 5


def test_drain_with_scheduled_gives_up_on_a_task_that_never_ends(jq: JobQueue) -> None:
    @jq.task(max_attempts=1_000)
    def forever() -> None:
        raise Retry(delay=60)

    forever.enqueue()
    with pytest.raises(DrainError, match="after 3 rounds"):
        drain(jq, include_scheduled=True, max_rounds=3)


def test_drain_only_named_queues(jq: JobQueue) -> None:
    @jq.task(queue="a")
    def in_a() -> None: ...

    @jq.task(queue="b")
    def in_b() -> None: ...

    in_a.enqueue()
    kept = in_b.enqueue()
    assert drain(jq, queues=["a"]) == {"completed": 1}
    assert jq.get_job(kept.id).status == "available"


def test_drain_runs_no_periodics(jq: JobQueue) -> None:
    @jq.periodic(every=1)
    @jq.task()
    def tick() -> None: ...

    assert drain(jq) == {}
    assert jq.stats() == {}


def test_assert_enqueued(jq: JobQueue) -> None:
    @jq.task()
    def send(to: str, subject: str = "hi") -> None: ...

    send.enqueue(to="a@example.com")
    send.options(delay=60).enqueue(to="b@example.com", subject="later")
    assert len(assert_enqueued(send)) == 2
    assert_enqueued(send, count=2)
    (job,) = assert_enqueued(send, {"to": "b@example.com"})
    assert job.args == {"to": "b@example.com", "subject": "later"}
    assert_enqueued("send", {"to": "a@example.com"}, count=1, jq=jq)
    refute_enqueued(send, {"to": "c@example.com"})
    with pytest.raises(AssertionError, match=r"expected 3 enqueued 'send' job\(s\), found 2"):
        assert_enqueued(send, count=3)
    with pytest.raises(AssertionError, match=r"b@example\.com"):
        assert_enqueued(send, {"to": "nobody"})
    drain(jq)
    # The delayed one still waits; the other ran.
    assert_enqueued(send, count=1)
    refute_enqueued(send, {"to": "a@example.com"})
    with pytest.raises(TypeError, match="jq="):
        assert_enqueued("send")


def test_assert_enqueued_compares_args_as_json_values(jq: JobQueue) -> None:
    # Break-test: assert_enqueued(t, {"order_id": True}) passed for a job
    # stored with order_id 1 (Python's True == 1).
    @jq.task()
    def ship(order_id: Any, lines: Any = None) -> None: ...

    ship.enqueue(order_id=1, lines=[1, {"gift": False}])
    assert_enqueued(ship, {"order_id": 1})
    assert_enqueued(ship, {"order_id": 1.0})  # numbers by value
    assert_enqueued(ship, {"lines": [1, {"gift": False}]})
    refute_enqueued(ship, {"order_id": True})
    refute_enqueued(ship, {"lines": [True, {"gift": False}]})
    refute_enqueued(ship, {"lines": [1, {"gift": 0}]})
    refute_enqueued(ship, {"order_id": "1"})


def test_run_task_gives_a_job_context(jq: JobQueue) -> None:
    @jq.task(max_attempts=3)
    def whoami(tag: str) -> dict:
        job = current_job()
        return {"task": job.task, "attempt": job.attempt, "tag": tag, "max": job.max_attempts}

    @jq.task()
    async def async_whoami(values: list[int]) -> int:
        return current_job().attempt + sum(values)

    @jq.task()
    def discard() -> None:
        raise Discard("no")

    assert run_task(whoami, tag="x") == {"task": "whoami", "attempt": 1, "tag": "x", "max": 3}
    assert run_task(async_whoami, values=[1, 2]) == 4
    with pytest.raises(PayloadError, match="tuple"):  # as enqueue would refuse it
        run_task(async_whoami, values=(1, 2))
    with pytest.raises(Discard):
        run_task(discard)
    with pytest.raises(Exception, match="unexpected"):
        run_task(whoami, tag="x", nope=1)
    with job_context(whoami, {"tag": "y"}, attempt=3) as job:
        assert current_job() is job
        assert job.attempt == 3
    with pytest.raises(LookupError):
        current_job()
    assert jq.stats() == {}  # nothing was written


def test_plugin_in_a_users_project(tmp_path: Path) -> None:
    """A project that only installs jobkeeper gets the fixtures, on SQLite by
    default and on a fresh PostgreSQL schema when pointed at a server; with
    ``jobkeeper_app`` the fixture is the application's own queue."""
    (tmp_path / "myapp.py").write_text(
        textwrap.dedent(
            """
            from jobkeeper import JobQueue, current_job

            jq = JobQueue("sqlite:///never-used.db")

            @jq.task()
            def welcome(user_id: int) -> str:
                follow_up.enqueue(user_id=user_id)
                return f"welcome {user_id} (attempt {current_job().attempt})"

            @jq.task()
            def follow_up(user_id: int) -> None: ...
            """
        )
    )
    (tmp_path / "test_app.py").write_text(
        textwrap.dedent(
            """
            from jobkeeper.testing import assert_enqueued, drain, refute_enqueued
            import myapp

            def test_welcome(jobkeeper_queue, jobkeeper_database_url):
                assert jobkeeper_queue is myapp.jq
                assert jobkeeper_queue.url.url == jobkeeper_database_url
                job = myapp.welcome.enqueue(user_id=7)
                assert_enqueued(myapp.welcome, {"user_id": 7})
                assert drain(jobkeeper_queue) == {"completed": 2}
                refute_enqueued(myapp.follow_up)
                assert jobkeeper_queue.get_job(job.id).result == "welcome 7 (attempt 1)"

            def test_isolated(jobkeeper_queue):
                assert jobkeeper_queue.stats() == {}
            """
        )
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\njobkeeper_app = myapp:jq\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER", "PYTEST"))}
    for extra in ([], ["--jobkeeper-database", PG_URL]):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 passed" in result.stdout
    assert not (tmp_path / "never-used.db").exists()


def test_run_task_inside_a_running_loop(jq: JobQueue) -> None:
    """Called where this thread already runs an event loop (an async test, a
    library driving one), run_task still runs an async task: asyncio.run
    cannot nest, so the task runs on a loop of its own, with the job context."""

    @jq.task()
    async def doubled(n: int) -> int:
        return n * 2 + current_job().attempt - 1

    async def caller() -> int:
        return run_task(doubled, n=4)

    # The loop runs in a thread of its own: this one may already run one (the
    # browser tests' Playwright leaves a loop running in the main thread).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, caller()).result(timeout=30) == 8


def test_the_helpers_import_without_pytest() -> None:
    # Django's test runner, unittest: code tested without pytest installed.
    code = "import sys; sys.modules['pytest'] = None; import jobkeeper.testing; print('imported')"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_a_test_schema_keeps_the_servers_own_options() -> None:
    separator = "&" if "?" in PG_URL else "?"
    server = f"{PG_URL}{separator}application_name=mine&options=-c%20statement_timeout%3D4321"
    with psycopg.connect(schema_url(server, "jk_schema_x")) as conn:
        shown = [
            conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("statement_timeout", "search_path", "application_name")
        ]
    assert shown == ["4321ms", "jk_schema_x", "mine"]
