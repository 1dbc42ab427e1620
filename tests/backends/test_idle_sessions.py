"""Sessions the server closes for sitting idle (``idle_session_timeout``,
``idle_in_transaction_session_timeout``), set here on our own sessions
through the URL's options (a break-test set them with ALTER DATABASE: each
worker logged about 180 warnings in 40 s, each saying the write "may have
committed" when nothing had been sent).
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import quote

import psycopg
import pytest

from jobkeeper import DatabaseError, DatabaseUnavailable, JobQueue


def _jobkeeper_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """jobkeeper's own warnings: the test queue's API pool (psycopg_pool) may
    also find its idle connection closed by the same timeout and says so in
    its own words ("discarding closed connection"), when its check runs."""
    return [
        r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("jobkeeper")
    ]


def with_setting(url: str, name: str, value: str) -> str:
    """``url`` (whose last parameter is ``options``, as ``pg_url``'s) with
    ``-c name=value`` added to its options.
    """
    assert "options=" in url.rsplit("&", 1)[-1].rsplit("?", 1)[-1]
    return url + quote(f" -c{name}={value}")


def test_a_dedicated_connection_closed_while_idle_is_replaced_quietly(pg_url, caplog):
    jq = JobQueue(with_setting(pg_url, "idle_session_timeout", "200"))
    jq.migrate()
    backend = jq.backend.dedicated("heartbeat test")
    caplog.set_level(logging.DEBUG, logger="jobkeeper")
    try:
        backend.worker_list()
        for _ in range(3):
            time.sleep(0.6)  # the server closes the session 0.2 s into it
            backend.worker_list()  # no error: replaced before use
    finally:
        backend.close()
        jq.close()
    closed = [r for r in caplog.records if "closed the idle connection" in r.getMessage()]
    # Said once at INFO for the connection, then at DEBUG.
    assert [r.levelno for r in closed] == [logging.INFO, logging.DEBUG, logging.DEBUG]
    assert "jobkeeper heartbeat test" in closed[0].getMessage()
    assert "idle-session timeout" in closed[0].getMessage()
    assert _jobkeeper_warnings(caplog) == []


def test_a_call_that_meets_an_idle_session_closed_says_nothing_was_written(pg_url, monkeypatch):
    # The close can land after the check, as the statement goes out: the
    # server closed the session before reading it, so nothing of it ran. It
    # was reported as "lost during the call ... may have committed".
    jq = JobQueue(with_setting(pg_url, "idle_session_timeout", "200"))
    jq.migrate()
    backend = jq.backend.dedicated("race")
    # As if the close landed after the check.
    monkeypatch.setattr("jobkeeper.backends.postgres.single.has_unread_input", lambda conn: False)
    try:
        backend.worker_list()
        time.sleep(0.6)
        with pytest.raises(DatabaseUnavailable) as caught:
            backend.worker_list()
        message = str(caught.value)
        assert "idle_session_timeout" in message
        assert "nothing of the call was written" in message
        assert "lost during the call" not in message
        assert "may have committed" not in message
        assert caught.value.unreachable is False  # the server answered
        assert caught.value.retry_asked is True  # and a rerun is safe
        backend.worker_list()  # the next call reconnects
    finally:
        backend.close()
        jq.close()


def test_a_transaction_left_idle_past_its_timeout_was_rolled_back(pg_url):
    # 25P03 is no OperationalError: it read "PostgreSQL error: terminating
    # connection due to idle-in-transaction timeout", a DatabaseError that
    # callers who retry on DatabaseUnavailable did not retry.
    jq = JobQueue(with_setting(pg_url, "idle_in_transaction_session_timeout", "200"))
    jq.migrate()
    try:
        with (
            pytest.raises(DatabaseUnavailable) as caught,
            jq.backend._cursor(transaction=True) as cursor,
        ):
            cursor.execute("SELECT 1")
            time.sleep(0.6)
            cursor.execute("SELECT 1")
        message = str(caught.value)
        assert "rolled back" in message
        assert "nothing of the call was written" in message
        assert "lost during the call" not in message
        assert caught.value.unreachable is False
        assert caught.value.retry_asked is True
        assert jq.list_jobs(limit=1) == []  # the pool replaced the session
    finally:
        jq.close()


def test_a_listen_connection_closed_while_idle_is_reopened_without_warnings(pg_url, caplog):
    # A LISTEN session is idle by design; each close came as a WARNING
    # "LISTEN connection lost (consuming input failed: server closed the
    # connection unexpectedly)", libpq having taken the server's reason
    # for a notice.
    jq = JobQueue(with_setting(pg_url, "idle_session_timeout", "300"))
    jq.migrate()
    caplog.set_level(logging.DEBUG, logger="jobkeeper")
    stop = threading.Event()
    thread = threading.Thread(
        target=jq.backend.listen, kwargs={"on_queue": lambda queue: None, "stop": stop}
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            sum("idle LISTEN" in r.getMessage() for r in caplog.records) < 3
        ):
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(10)
        jq.close()
    closed = [r for r in caplog.records if "closed the idle LISTEN connection" in r.getMessage()]
    assert len(closed) >= 3
    assert [r.levelno for r in closed][:3] == [logging.INFO, logging.DEBUG, logging.DEBUG]
    assert "idle-session timeout" in closed[0].getMessage()
    assert _jobkeeper_warnings(caplog) == []


def test_a_serialization_failure_is_marked_retry_asked(pg_url):
    # Under default_transaction_isolation = 'serializable', the break-test's
    # setting: a write that lost a race with a committed one fails with
    # 40001, which the worker's loops log as a lost race, not an error.
    jq = JobQueue(with_setting(pg_url, "default_transaction_isolation", "serializable"))
    jq.migrate()
    job = jq.enqueue("anything", {})
    schema = pg_url.split("search_path%3D")[-1]
    update = f'UPDATE "{schema}".jobkeeper_jobs SET priority = priority + 1 WHERE id = {job.id}'
    try:
        with psycopg.connect(pg_url, autocommit=True) as other:
            with other.transaction():
                other.execute(update)
                failed: list[BaseException] = []

                def write() -> None:
                    try:
                        jq.backend._fetch_raw(update)
                    except BaseException as exc:
                        failed.append(exc)

                thread = threading.Thread(target=write)
                thread.start()
                time.sleep(0.5)  # the write waits on the row lock
            thread.join(10)
        assert len(failed) == 1 and isinstance(failed[0], DatabaseError)
        assert failed[0].retry_asked is True
        assert not isinstance(failed[0], DatabaseUnavailable)
    finally:
        jq.close()


def _pool_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "psycopg.pool" and r.levelno >= logging.WARNING
    ]


def test_sync_calls_after_the_pools_sessions_timed_out_log_no_pool_warnings(pg_url, caplog):
    # jobkeeper found each closed session on checkout and replaced it, and
    # psycopg_pool still logged a WARNING "discarding closed connection" per
    # session it was handed back: noise in the application's log after
    # every quiet spell.
    jq = JobQueue(with_setting(pg_url, "idle_session_timeout", "200"), pool_size=4)
    jq.migrate()
    caplog.set_level(logging.INFO, logger="psycopg.pool")
    opened = threading.Barrier(4)

    def hold_one() -> None:
        with jq.backend._cursor() as cursor:
            cursor.execute("SELECT 1")
            opened.wait(10)  # four connections out at once

    try:
        threads = [threading.Thread(target=hold_one) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        time.sleep(0.6)  # the server closes all four
        caplog.clear()
        for _ in range(8):
            jq.enqueue("anything", {})
        assert len(jq.list_jobs(limit=100)) == 8
    finally:
        jq.close()
    assert _pool_warnings(caplog) == []


def test_an_async_call_after_the_pools_sessions_timed_out_takes_the_next_without_backoff(
    pg_url, caplog, monkeypatch
):
    # The async pool checked connections through psycopg_pool's ``check``,
    # which waits 1 s, then 2, 4... after each connection that fails it: an
    # enqueue_async after the server closed four idle sessions took 7.6 s
    # (and logged a WARNING per session).
    import asyncio

    from psycopg_pool import pool_async

    waits: list[float] = []
    real_sleep = pool_async.asleep

    async def noted_sleep(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(seconds)

    monkeypatch.setattr(pool_async, "asleep", noted_sleep)
    jq = JobQueue(with_setting(pg_url, "idle_session_timeout", "200"), pool_size=4)
    jq.migrate()
    caplog.set_level(logging.INFO, logger="psycopg.pool")

    async def calls() -> None:
        pool = (await jq.backend._async_pool()).pool
        held = [await pool.getconn() for _ in range(4)]
        for conn in held:
            await pool.putconn(conn)
        await asyncio.sleep(0.6)  # the server closes all four
        caplog.clear()
        await jq.enqueue_async("anything", {})
        await jq.aclose()

    try:
        asyncio.run(calls())
        assert len(jq.list_jobs(limit=10)) == 1
    finally:
        jq.close()
    assert waits == []
    assert _pool_warnings(caplog) == []


def test_only_connections_closed_on_purpose_are_kept_out_of_the_pool_log():
    from jobkeeper.backends.postgres.pool_logs import ClosedOnPurpose, mark_on_purpose

    class Conn:
        pass

    def record(conn: object) -> logging.LogRecord:
        return logging.LogRecord(
            "psycopg.pool", logging.WARNING, __file__, 1, "discarding closed connection: %s",
            (conn,), None,
        )  # fmt: skip

    marked, unmarked = Conn(), Conn()
    mark_on_purpose(marked)
    kept = ClosedOnPurpose().filter
    assert not kept(record(marked))
    assert kept(record(unmarked))
