"""A pool whose new sessions all fail jobkeeper's set-up of them says so,
at once, instead of waiting out its 10 s and blaming a busy pool.

With ``statement_timeout = '1ms'`` set for the database (here through the
URL's options, which the server applies at session start the same way),
every enqueue_async and a sync migrate() waited 10 s and failed "all 10
stayed in use (JobQueue's pool_size)": the server answered the probe's
plain connect, and the set-up's statement timeout only showed as a
psycopg.pool WARNING.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from jobkeeper import DatabaseError, JobQueue
from jobkeeper.backends.postgres.pool_setup import SetupFailures, busy_pool_message

#: Well under the pool's 10 s wait, well over its 0.5 s slice and a probe.
PROMPT = 4.0


def timed_out_sessions(pg_url: str) -> str:
    """``pg_url`` (a fresh schema's, migrated) with sessions whose every
    statement is cancelled by a 1 ms statement_timeout.
    """
    JobQueue(pg_url).migrate()
    return pg_url.replace("options=", "options=-cstatement_timeout%3D1%20", 1)


def assert_names_the_set_up(error: BaseException) -> None:
    text = str(error)
    assert "no new session could be set up" in text, text
    assert "statement timeout" in text, text
    assert "in use" not in text, text


def test_a_sync_call_names_the_failed_session_set_up_at_once(pg_url):
    jq = JobQueue(timed_out_sessions(pg_url))
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseError) as raised:
            jq.migrate()
        assert time.monotonic() - started < PROMPT
        assert_names_the_set_up(raised.value)
    finally:
        jq.close()


def test_an_async_call_names_the_failed_session_set_up_at_once(pg_url):
    jq = JobQueue(timed_out_sessions(pg_url))
    errors: list[tuple[float, BaseException]] = []

    async def main() -> None:
        for _ in range(3):
            started = time.monotonic()
            try:
                await jq.enqueue_async("anything", {})
            except DatabaseError as exc:
                errors.append((time.monotonic() - started, exc))
        await jq.aclose()

    try:
        asyncio.run(main())
        assert len(errors) == 3
        for took, error in errors:
            assert took < PROMPT
            assert_names_the_set_up(error)
    finally:
        jq.close()


class _Pool:
    def __init__(self, size: int, max_size: int) -> None:
        self.max_size = max_size
        self._size = size

    def get_stats(self) -> dict[str, int]:
        return {"pool_size": self._size, "pool_available": 0}


def test_all_in_use_is_said_only_when_the_pool_had_all_its_connections():
    failures = SetupFailures()
    pool: Any = _Pool(10, 10)
    assert "all 10 stayed in use" in busy_pool_message(10, pool, failures)
    pool = _Pool(2, 10)
    said = busy_pool_message(10, pool, failures)
    assert "in use" not in said and "2 of its 10 connections" in said, said
    failures.failed(RuntimeError("canceling statement due to statement timeout"))
    said = busy_pool_message(10, pool, failures)
    assert "failed jobkeeper's set-up" in said and "statement timeout" in said, said
    failures.succeeded()
    assert "2 of its 10" in busy_pool_message(10, pool, failures)


def test_a_session_closed_while_idle_before_its_set_up_is_no_refusal(pg_url):
    # Under a 50 ms idle_session_timeout and a busy process, a pool's new
    # session could sit past the timeout between its connect and its set-up:
    # counted as a refused set-up, a streak of one made the probe set up its
    # own session, meet the same close, and fail the call blaming "a setting
    # of the database or role" (break-test 137).
    import psycopg

    from jobkeeper.backends.postgres.pool_setup import probe

    failures = SetupFailures()
    failures.failed(psycopg.errors.IdleSessionTimeout("terminating connection"))
    failures.failed(psycopg.errors.IdleInTransactionSessionTimeout("terminating connection"))
    assert failures.streak == 0 and failures.last is None

    def closed_idle(conn: Any) -> None:
        raise psycopg.errors.IdleSessionTimeout(
            "terminating connection due to idle-session timeout"
        )

    failures.failed(psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))
    probe(pg_url, {}, closed_idle, failures)  # the server took the session: no error
