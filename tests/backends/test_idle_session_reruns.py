"""API calls whose pooled session the server closed for sitting idle just
after the pool's pre-use check passed it (``idle_session_timeout``, FATAL
57P05): nothing of the call reached the server, so the call runs once more on
another session. A break-test under ``idle_session_timeout = '300ms'`` saw 2
calls in about 800 fail with ``DatabaseUnavailable(retry_asked=True)``.

Made certain here: the pool's check is told the connection is fresh and its
socket quiet (as when the close lands right after the check), and each test
waits for the server's FATAL to reach the pooled connection before the call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobkeeper import DatabaseUnavailable, JobQueue
from jobkeeper.backends.postgres import loop_pools, sources
from support.db import count

from .helpers import with_pg_options

#: What a pooled session's socket says, read for real (the tests stub it).
socket_readable = sources.has_unread_input

RERUN = "running the call once more on another session"


@pytest.fixture
def idle_url(pg_url: str) -> str:
    return with_pg_options(pg_url, "-c idle_session_timeout=200")


@pytest.fixture
def unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both pools' pre-use checks pass every connection without a ping."""
    for module in (sources, loop_pools):
        monkeypatch.setattr(module, "has_unread_input", lambda conn: False)
        monkeypatch.setattr(module, "IDLE_CHECK_AFTER", 1e9)


def closed_by_server(conn: Any) -> None:
    """Wait until the server's FATAL for ``conn``'s idle session is on its socket."""
    deadline = time.monotonic() + 10
    while not socket_readable(conn):
        assert time.monotonic() < deadline, "the server did not close the idle session"
        time.sleep(0.05)


def pooled_connection(jq: JobQueue) -> psycopg.Connection[Any]:
    """The sync pool's connection (pool_size=1, the check stubbed: the same one)."""
    source = jq.backend._source  # type: ignore[attr-defined]
    conn: psycopg.Connection[Any] = source.checkout()
    source.checkin(conn, None)
    return conn


def reruns(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if RERUN in r.getMessage()]


SYNC_CALLS: dict[str, Callable[[JobQueue, int], Any]] = {
    "enqueue": lambda jq, job_id: jq.enqueue("anything", {"n": 2}),
    "enqueue_many": lambda jq, job_id: jq.enqueue_many([("anything", {"n": i}) for i in range(5)]),
    "enqueue_many_keyed": lambda jq, job_id: jq.enqueue_many(
        [("anything", {"n": i}, {"unique_key": f"k{i}"}) for i in range(5)]
    ),
    "enqueue_many_copy": lambda jq, job_id: jq.enqueue_many(
        [("anything", {"n": i}) for i in range(2000)]
    ),
    "get_job": lambda jq, job_id: jq.get_job(job_id),
    "list_jobs": lambda jq, job_id: jq.list_jobs(limit=10),
    "cancel": lambda jq, job_id: jq.cancel(job_id),
    "stats": lambda jq, job_id: jq.stats(),
    "health": lambda jq, job_id: jq.health(),
}


@pytest.mark.parametrize("call", sorted(SYNC_CALLS))
def test_a_sync_call_whose_pooled_session_was_closed_while_idle_runs_again(
    idle_url: str, unchecked: None, caplog: pytest.LogCaptureFixture, call: str
) -> None:
    jq = JobQueue(idle_url, pool_size=1)
    jq.migrate()
    try:
        first = jq.enqueue("anything", {"n": 1})
        closed_by_server(pooled_connection(jq))
        caplog.set_level(logging.DEBUG, logger="jobkeeper")
        result = SYNC_CALLS[call](jq, first.id)  # raised DatabaseUnavailable
        if call == "get_job":
            assert result is not None and result.id == first.id
        if call == "health":
            # The write probe of its own: it read as "writes fail".
            assert result["write_error"] is None
    finally:
        jq.close()
    (rerun,) = reruns(caplog)
    assert rerun.levelno == logging.DEBUG
    assert "idle_session_timeout" in rerun.getMessage()
    added = {"enqueue": 1, "enqueue_many": 5, "enqueue_many_keyed": 5, "enqueue_many_copy": 2000}
    assert count(jq) == 1 + added.get(call, 0)  # written once, not twice


ASYNC_CALLS: dict[str, Callable[[JobQueue, int], Any]] = {
    "enqueue_async": lambda jq, job_id: jq.enqueue_async("anything", {"n": 2}),
    "enqueue_many_async": lambda jq, job_id: jq.enqueue_many_async(
        [("anything", {"n": i}, {"unique_key": f"k{i}"}) for i in range(5)]
    ),
    "get_job_async": lambda jq, job_id: jq.get_job_async(job_id),
}


@pytest.mark.parametrize("call", sorted(ASYNC_CALLS))
def test_an_async_call_whose_pooled_session_was_closed_while_idle_runs_again(
    idle_url: str, unchecked: None, caplog: pytest.LogCaptureFixture, call: str
) -> None:
    jq = JobQueue(idle_url, pool_size=1)
    jq.migrate()

    async def calls() -> Any:
        first = await jq.enqueue_async("anything", {"n": 1})
        spare = (await jq.backend._async_pool()).spare  # type: ignore[attr-defined]
        assert spare is not None  # the connection the next call takes
        await asyncio.to_thread(closed_by_server, spare)
        caplog.set_level(logging.DEBUG, logger="jobkeeper")
        result = await ASYNC_CALLS[call](jq, first.id)  # raised DatabaseUnavailable
        await jq.aclose()
        return first, result

    try:
        first, result = asyncio.run(calls())
    finally:
        jq.close()
    if call == "get_job_async":
        assert result is not None and result.id == first.id
    (rerun,) = reruns(caplog)
    assert rerun.levelno == logging.DEBUG
    added = {"enqueue_async": 1, "enqueue_many_async": 5}
    assert count(jq) == 1 + added.get(call, 0)


@pytest.mark.parametrize("autocommit", [False, True])
def test_an_enqueue_on_the_callers_connection_closed_while_idle_is_not_run_again(
    idle_url: str, unchecked: None, caplog: pytest.LogCaptureFixture, autocommit: bool
) -> None:
    # The caller's session and transaction are the caller's: a rerun would
    # meet the same closed session, or a transaction that is no more.
    jq = JobQueue(idle_url, pool_size=1)
    jq.migrate()
    caplog.set_level(logging.DEBUG, logger="jobkeeper")
    try:
        with psycopg.connect(idle_url, autocommit=autocommit) as conn:
            jq.enqueue("anything", {}, connection=conn)
            conn.commit()
            closed_by_server(conn)
            with pytest.raises(DatabaseUnavailable) as caught:
                jq.enqueue("anything", {}, connection=conn)
        assert caught.value.retry_asked is True  # the caller may run it again
    finally:
        jq.close()
    assert reruns(caplog) == []
    assert count(jq) == 1


def test_a_pooled_session_cut_without_the_servers_word_is_not_run_again(
    pg_url: str, unchecked: None, caplog: pytest.LogCaptureFixture
) -> None:
    # When the server's FATAL is lost (a large statement or a pipeline that
    # met the close: the reset beat it), libpq says only "server closed the
    # connection unexpectedly", as it does for a session cut with a statement
    # in flight, which may have committed: never run again by itself. Here
    # the server side of the pooled session's socket is shut as if so.
    jq = JobQueue(pg_url, pool_size=1)
    jq.migrate()
    caplog.set_level(logging.DEBUG, logger="jobkeeper")
    try:
        jq.enqueue("anything", {})
        conn = pooled_connection(jq)
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RD)  # reads end: the server "closed" it
        with pytest.raises(DatabaseUnavailable) as caught:
            jq.enqueue("anything", {})
        assert caught.value.retry_asked is False
        assert "may have committed" in str(caught.value)
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        assert caught.value.__cause__.sqlstate is None
        jq.enqueue("anything", {})  # the next call takes another session
    finally:
        jq.close()
    assert reruns(caplog) == []
    # The server did get the cut one, and committed it: a rerun would have
    # stored the job twice.
    assert count(jq) == 3


#: The stress tests' idle_session_timeout (ms): short, so that many calls
#: race the close in a few seconds.
STRESS_TIMEOUT_MS = 20


def _pause_about_the_timeout() -> None:
    # Spun: time.sleep may oversleep by more than the +-0.5 ms aimed at.
    until = time.perf_counter() + STRESS_TIMEOUT_MS / 1000 + random.uniform(-0.0005, 0.0005)
    while time.perf_counter() < until:
        pass


def _unexplained(errors: list[DatabaseUnavailable]) -> list[str]:
    """The failures a caller should not have seen: a session closed while
    idle (retry_asked) reached the caller. A session whose FATAL was lost
    ("may have committed") must still raise, so it is allowed.
    """
    return [str(e) for e in errors if e.retry_asked or "may have committed" not in str(e)]


@pytest.mark.slow
def test_sync_calls_pausing_about_the_idle_timeout_do_not_fail(pg_url: str) -> None:
    # The break-test's pattern with the pool's real checks: calls after
    # pauses of about the timeout. Without the rerun, about 1 call in 5 here
    # failed with DatabaseUnavailable(retry_asked=True). pool_size=1: each
    # call takes the session the one before returned (with the default pool
    # the same loop raced 1 call in 60, and took three times as long).
    jq = JobQueue(
        with_pg_options(pg_url, f"-c idle_session_timeout={STRESS_TIMEOUT_MS}"), pool_size=1
    )
    jq.migrate()
    errors: list[DatabaseUnavailable] = []
    try:
        jq.enqueue("anything", {})
        for i in range(60):
            _pause_about_the_timeout()
            try:
                if i % 3 == 0:
                    jq.enqueue("anything", {"i": i})
                elif i % 3 == 1:
                    jq.list_jobs(limit=1)
                else:
                    jq.enqueue_many([("anything", {"i": i}), ("anything", {"i": -i})])
            except DatabaseUnavailable as exc:
                errors.append(exc)
    finally:
        jq.close()
    assert _unexplained(errors) == []


@pytest.mark.slow
def test_async_calls_pausing_about_the_idle_timeout_do_not_fail(pg_url: str) -> None:
    jq = JobQueue(
        with_pg_options(pg_url, f"-c idle_session_timeout={STRESS_TIMEOUT_MS}"), pool_size=1
    )
    jq.migrate()
    errors: list[DatabaseUnavailable] = []

    async def calls() -> None:
        first = await jq.enqueue_async("anything", {})
        for i in range(60):
            _pause_about_the_timeout()
            try:
                if i % 2 == 0:
                    await jq.enqueue_async("anything", {"i": i})
                else:
                    await jq.get_job_async(first.id)
            except DatabaseUnavailable as exc:
                errors.append(exc)
        await jq.aclose()

    try:
        asyncio.run(calls())
    finally:
        jq.close()
    assert _unexplained(errors) == []
