"""The single enqueue's statement, run through libpq itself
(backends/postgres/direct.py): prepared once per connection that reaches
PostgreSQL, sent unprepared otherwise, its binary columns decoded exactly,
and a refusal raised as psycopg's error, as a cursor's would be.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from jobkeeper import JobQueue, QueueFull
from jobkeeper.backends.postgres.direct import direct_statement, run_direct, run_direct_async
from jobkeeper.backends.postgres.prepared import PREPARE_THRESHOLD
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.errors import DatabaseError
from support.db import sql

INSERT_NOW = direct_statement("job_insert_many_now", QUERIES["job_insert_many_now"])
#: A statement returning one column of each type the decoder knows, and one it does not.
PROBE = direct_statement(
    "probe",
    "SELECT $1::bigint AS n, $2::timestamptz AS at, $1::text AS other",
)


def _insert_params(channel: str = "jk_test_channel") -> tuple[bytes | None, ...]:
    return (b"default", b"anything", b'{"x": "\xc3\xa9"}', b"0", b"20", None, channel.encode())


def _prepared_names(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'jobkeeper_%' ORDER BY name",
        prepare=False,
    ).fetchall()
    return [row[0] for row in rows]


def _connect(url: str, *, prepares: bool) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
    if prepares:
        conn.prepare_threshold = PREPARE_THRESHOLD
    return conn


def test_a_direct_connection_prepares_the_single_insert_once(pg_url: str) -> None:
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        for i in range(5):
            jq.enqueue("anything", {"i": i})
        # A single-threaded caller's pool keeps one connection: this one.
        rows = jq.backend._fetch_raw(  # type: ignore[attr-defined]
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'jobkeeper_%%'"
        )
        assert [row[0] for row in rows] == [INSERT_NOW.name.decode()]
        stored = sql(jq, "SELECT args->>'i' FROM jobkeeper_jobs ORDER BY id")
        assert [row[0] for row in stored] == ["0", "1", "2", "3", "4"]
    finally:
        jq.close()


def test_a_pooler_connection_sends_the_insert_unprepared(pg_url: str) -> None:
    JobQueue(pg_url).migrate()
    with _connect(pg_url, prepares=False) as conn:
        first = run_direct(conn, INSERT_NOW, _insert_params())
        second = run_direct(conn, INSERT_NOW, _insert_params())
        assert _prepared_names(conn) == []
    assert second[0][0] == first[0][0] + 1


def test_the_returned_id_and_time_are_the_stored_ones(pg_url: str) -> None:
    # Binary timestamps count from 2000-01-01 UTC whatever the session's
    # TimeZone; a datetime off by a microsecond or an hour would show here.
    assert "options=" in pg_url  # its search_path: add to it, not beside it
    jq = JobQueue(pg_url.replace("options=", "options=-cTimeZone%3DAsia/Kathmandu%20", 1))
    jq.migrate()
    try:
        job = jq.enqueue("anything", {"名": "é"}, queue="q.1")
        stored = jq.get_job(job.id)
        assert stored is not None
        assert job.created_at == stored.created_at == stored.scheduled_at
        assert job.created_at.utcoffset() is not None
        assert job.created_at.tzinfo == UTC
        assert (stored.args, stored.queue) == ({"名": "é"}, "q.1")
        when = sql(jq, "SELECT extract(epoch FROM created_at) FROM jobkeeper_jobs")[0][0]
        assert job.created_at.timestamp() == pytest.approx(float(when), abs=1e-6)
    finally:
        jq.close()


def test_decoding_covers_negative_values_and_leaves_other_types_out(pg_url: str) -> None:
    before_2000 = datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    for prepares in (False, True):
        with _connect(pg_url, prepares=prepares) as conn:
            for _ in range(2):
                rows = run_direct(conn, PROBE, (b"-5", before_2000.isoformat().encode()))
                assert rows == [(-5, before_2000, None)]
            nulls = run_direct(conn, PROBE, (None, None))
            assert nulls == [(None, None, None)]


def test_a_prepare_whose_answer_was_cut_short_is_taken_as_made(pg_url: str) -> None:
    # A cancel (Ctrl-C, a cancelled task) can end the wait after the server
    # prepared the statement but before the name was noted as prepared.
    with _connect(pg_url, prepares=True) as conn:
        conn.pgconn.prepare(PROBE.name, PROBE.sql)
        assert run_direct(conn, PROBE, (b"7", None)) == [(7, None, None)]
        assert _prepared_names(conn) == [PROBE.name.decode()]


def test_a_refused_statement_raises_psycopg_error_and_leaves_the_connection_usable(
    pg_url: str,
) -> None:
    with _connect(pg_url, prepares=True) as conn:
        for _ in range(2):
            with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                run_direct(conn, PROBE, (b"not a number", None))
            assert run_direct(conn, PROBE, (b"1", None)) == [(1, None, None)]
        conn.execute("BEGIN")
        with pytest.raises(psycopg.ProgrammingError, match="outside a transaction"):
            run_direct(conn, PROBE, (b"1", None))
        conn.execute("ROLLBACK")
        conn.close()
        with pytest.raises(psycopg.OperationalError, match="closed"):
            run_direct(conn, PROBE, (b"1", None))


def test_an_enqueue_whose_session_is_killed_is_refused_and_the_next_one_lands(
    pg_url: str,
) -> None:
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        jq.enqueue("anything", {})
        pid = jq.backend._fetch_raw("SELECT pg_backend_pid()")[0][0]  # type: ignore[attr-defined]
        sql(pg_url, "SELECT pg_terminate_backend(?)", (pid,))
        # The pool's checkout sees the notice on the socket and replaces
        # the connection; either way no enqueue is lost or doubled.
        outcomes = []
        for i in range(3):
            try:
                outcomes.append(jq.enqueue("anything", {"i": i}).id)
            except DatabaseError:
                outcomes.append(None)
        assert outcomes[-1] is not None
        stored = sql(jq, "SELECT id FROM jobkeeper_jobs WHERE args->>'i' IS NOT NULL ORDER BY id")
        assert [row[0] for row in stored] == [o for o in outcomes if o is not None]
    finally:
        jq.close()


def test_the_async_path_prepares_and_decodes_the_same(pg_url: str) -> None:
    async def run() -> list[list[tuple[Any, ...]]]:
        async with await psycopg.AsyncConnection.connect(
            pg_url, autocommit=True, prepare_threshold=PREPARE_THRESHOLD
        ) as conn:
            results = [await run_direct_async(conn, PROBE, (b"3", None)) for _ in range(2)]
            cursor = await conn.execute(
                "SELECT name FROM pg_prepared_statements WHERE name LIKE 'jobkeeper_%'",
                prepare=False,
            )
            results.append(await cursor.fetchall())
            return results

    first, second, names = asyncio.run(run())
    assert first == second == [(3, None, None)]
    assert names == [(PROBE.name.decode(),)]


def test_the_insert_is_prepared_again_once_the_session_dropped_it(pg_url: str) -> None:
    # psycopg itself sends DEALLOCATE ALL on a session after some statements
    # and rollbacks; the name noted as prepared is then stale.
    with _connect(pg_url, prepares=True) as conn:
        assert run_direct(conn, PROBE, (b"1", None)) == [(1, None, None)]
        conn.execute("DEALLOCATE ALL")
        assert run_direct(conn, PROBE, (b"2", None)) == [(2, None, None)]
        assert _prepared_names(conn) == [PROBE.name.decode()]


def test_plain_enqueues_go_on_after_a_refused_one_rolled_back(pg_url: str) -> None:
    # A QueueFull rolls back the checked insert's transaction, and psycopg
    # deallocates every statement of the session with it (when it had
    # prepared some of its own): the plain enqueues that follow on the same
    # pooled connection used to fail with "prepared statement ... does not
    # exist" until the pool replaced the connection.
    jq = JobQueue(pg_url, pool_size=1)
    jq.migrate()
    try:
        jq.configure_queue("limited", max_pending=1)
        jq.enqueue("anything", {}, queue="limited")
        for _ in range(6):  # psycopg prepares its own after five runs
            with pytest.raises(QueueFull):
                jq.enqueue("anything", {}, queue="limited")
            jq.enqueue("anything", {})
        assert sql(jq, "SELECT queue, count(*) FROM jobkeeper_jobs GROUP BY 1 ORDER BY 1") == [
            ("default", 6),
            ("limited", 1),
        ]
    finally:
        jq.close()


def test_async_enqueues_go_on_after_a_refused_one_rolled_back(pg_url: str) -> None:
    async def run(jq: JobQueue) -> None:
        try:
            for _ in range(8):
                await jq.enqueue_async("anything", {}, queue="limited")
            for _ in range(4):
                with pytest.raises(QueueFull):
                    await jq.enqueue_async("anything", {}, queue="limited")
                await jq.enqueue_async("anything", {})
        finally:
            await jq.aclose()

    jq = JobQueue(pg_url, pool_size=1)
    jq.migrate()
    try:
        jq.configure_queue("limited", max_pending=8)
        asyncio.run(run(jq))
        assert sql(jq, "SELECT queue, count(*) FROM jobkeeper_jobs GROUP BY 1 ORDER BY 1") == [
            ("default", 4),
            ("limited", 8),
        ]
    finally:
        jq.close()
