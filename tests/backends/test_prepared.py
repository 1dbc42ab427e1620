"""Server-side prepared statements on PostgreSQL: made on connections that
reach the server itself (never through a pooler: tests/pgbouncer), and
kept working when a migration changes the tables under them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from backends.helpers import WORKER, claim, complete, fail, register
from jobkeeper import JobQueue
from jobkeeper.backends.postgres.prepared import direct_session
from jobkeeper.backends.postgres.queries import (
    DEAD_LETTER_COLUMNS,
    JOB_COLUMNS,
    JOB_COLUMNS_SQL_ONLY,
)
from jobkeeper.errors import DatabaseError
from jobkeeper.models import Claim, Completion, Failure
from jobkeeper.outcomes import error_entry
from support.db import sql

#: Enough runs for every statement below to pass psycopg's threshold (5) on
#: each connection of a pool that opened two or three.
RUNS = 16


def _prepared_inserts(jq: JobQueue) -> int:
    """Prepared statements of the pooled session that inserts jobs (the pool
    of a single-threaded caller keeps one connection)."""
    rows = jq.backend._fetch_raw(  # type: ignore[attr-defined]
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
        ("%INSERT INTO jobkeeper_jobs%",),
    )
    return int(rows[0][0])


def _exercise(jq: JobQueue) -> list[int]:
    """Every statement that returns whole job rows, RUNS times."""
    ids = []
    for i in range(RUNS):
        job = jq.enqueue("anything", {"i": i})
        ids.append(job.id)
        assert jq.get_job(job.id) is not None
        assert jq.list_jobs(limit=5)
        (held,) = claim(jq, limit=1)
        complete(jq, held)
        jq.enqueue_many([("anything", {"i": i}), ("anything", {"i": -i})])
        for held in claim(jq, limit=2):
            fail(jq, held, "dead")
            assert jq.get_job(held.id) is not None
        assert jq.list_jobs(status="dead", limit=5)
    return ids


def test_a_direct_connection_prepares_its_statements(pg_url: str) -> None:
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        for i in range(RUNS):
            jq.enqueue("anything", {"i": i})
        assert _prepared_inserts(jq) >= 1
    finally:
        jq.close()


def test_a_pooler_session_is_told_from_a_direct_one() -> None:
    # A pooler answers the startup with a backend key of its own.
    assert direct_session(4242, 4242)
    assert not direct_session(4242, 777)
    assert not direct_session(4242, None)


def test_statements_prepared_before_a_migration_added_columns_keep_working(
    pg_url: str,
) -> None:
    # A statement returning "*" was prepared with the table's columns of the
    # moment; once a migration adds one, PostgreSQL refuses it ("cached plan
    # must not change result type") on every run, on every connection of
    # every worker deployed before the migration.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        _exercise(jq)
        sql(pg_url, "ALTER TABLE jobkeeper_jobs ADD COLUMN added_later integer")
        sql(pg_url, "ALTER TABLE jobkeeper_dead_letters ADD COLUMN added_later integer")
        ids = _exercise(jq)
        assert all(job is not None for job in (jq.get_job(i) for i in ids))
    finally:
        jq.close()


def test_a_statement_made_stale_by_a_type_change_fails_once_then_works(
    pg_url: str,
) -> None:
    # A changed column type alters even a named column list: the call that
    # meets it fails (having done nothing), its connection is given up, and
    # the next call prepares afresh instead of failing forever.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        job = jq.enqueue("anything", {})
        for _ in range(RUNS):
            assert jq.get_job(job.id) is not None
        sql(pg_url, "ALTER TABLE jobkeeper_jobs ALTER COLUMN priority TYPE bigint")
        with pytest.raises(DatabaseError, match="schema change"):
            jq.get_job(job.id)
        for _ in range(RUNS):
            fetched = jq.get_job(job.id)
            assert fetched is not None and fetched.priority == 0
    finally:
        jq.close()


def test_an_insert_made_stale_by_a_type_change_is_run_again(pg_url: str) -> None:
    # An insert of our own transaction did nothing when refused: it is run
    # again on a fresh connection, and the caller sees one stored job.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        for i in range(RUNS):
            jq.enqueue_many([("anything", {"i": i}), ("anything", {"i": -i})])
        sql(pg_url, "ALTER TABLE jobkeeper_jobs ALTER COLUMN priority TYPE bigint")
        jobs = jq.enqueue_many([("anything", {"n": 1}), ("anything", {"n": 2})])
        assert [j.args for j in jobs] == [{"n": 1}, {"n": 2}]
        stored = sql(pg_url, "SELECT args::text FROM jobkeeper_jobs WHERE (args->>'n') IS NOT NULL")
        assert sorted(row[0] for row in stored) == ['{"n":1}', '{"n":2}']
    finally:
        jq.close()


def _columns(url: str, table: str) -> tuple[Any, ...]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            (table,),
        ).fetchall()
    return tuple(row[0] for row in rows)


def test_the_named_columns_are_the_migrated_tables_columns(pg_url: str) -> None:
    # A migration that adds a column must also add it to the lists the
    # statements name, or this version never reads it (or say that only the
    # SQL reads it).
    JobQueue(pg_url).migrate()
    assert _columns(pg_url, "jobkeeper_jobs") == JOB_COLUMNS + JOB_COLUMNS_SQL_ONLY
    assert _columns(pg_url, "jobkeeper_dead_letters") == DEAD_LETTER_COLUMNS


def test_an_async_insert_made_stale_by_a_type_change_is_run_again(pg_url: str) -> None:
    # The async pool prepares as the sync one does, and recovers the same way.
    jq = JobQueue(pg_url)
    jq.migrate()

    async def scenario() -> list[Any]:
        try:
            for i in range(RUNS):
                await jq.enqueue_many_async([("anything", {"i": i}), ("anything", {"i": -i})])
            sql(pg_url, "ALTER TABLE jobkeeper_jobs ALTER COLUMN priority TYPE bigint")
            jobs = await jq.enqueue_many_async([("anything", {"n": 1}), ("anything", {"n": 2})])
            return [j.args for j in jobs]
        finally:
            await jq.aclose()

    try:
        assert asyncio.run(scenario()) == [{"n": 1}, {"n": 2}]
    finally:
        jq.close()


def test_the_prepared_claim_keeps_to_the_indexes_on_a_generic_plan(pg_url: str) -> None:
    # Once prepared, PostgreSQL may run the claim on a generic plan, which
    # cannot know the LIMIT: it guessed a tenth of the table, and the UPDATE
    # hash-joined every row of the table to update a few (the drain of
    # 20,000 jobs ran at half its rate). Whatever plan the worker's session
    # picks, the claim reaches its rows through the indexes.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        for _ in range(10):
            jq.enqueue_many([("anything", {})] * 1000)
        sql(pg_url, "ANALYZE jobkeeper_jobs")
        register(jq)
        worker_backend = jq.backend.dedicated()  # type: ignore[attr-defined]
        try:
            for _ in range(RUNS):
                worker_backend.job_claim(worker_id=WORKER, queue="default", limit=10)
            (name,) = worker_backend._fetch_raw(
                "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
                ("%candidates AS MATERIALIZED%",),
            )[0]
            worker_backend._fetch_raw("SET plan_cache_mode = force_generic_plan")
            plan = worker_backend._fetch_raw(f"EXPLAIN EXECUTE {name}('default', 10, '{WORKER}')")
            text = "\n".join(row[0] for row in plan)
            assert "Seq Scan on jobkeeper_jobs" not in text, text
        finally:
            worker_backend.close()
    finally:
        jq.close()


def test_the_limited_claim_keeps_to_the_indexes_on_a_generic_plan(pg_url: str) -> None:
    # jobkeeper_claim_limited's statements are PL/pgSQL's cached plans, which
    # may go generic after five calls as prepared statements do: its claim
    # hash-joined the whole table. auto_explain shows the plans of the
    # function's statements (as notices to this session).
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        jq.configure_queue("default", concurrency=1000)
        for _ in range(10):
            jq.enqueue_many([("anything", {})] * 1000)
        sql(pg_url, "ANALYZE jobkeeper_jobs")
        notices: list[str] = []
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            for setting in (
                "LOAD 'auto_explain'",
                "SET auto_explain.log_min_duration = 0",
                "SET auto_explain.log_nested_statements = on",
                "SET plan_cache_mode = force_generic_plan",
                "SET client_min_messages = log",
            ):
                conn.execute(setting)
            for _ in range(3):
                conn.execute("SELECT id FROM jobkeeper_claim_limited('default', 'w', 10)")
        plans = [n for n in notices if "jobkeeper_jobs" in n]
        assert plans, notices
        assert not [p for p in plans if "Seq Scan on jobkeeper_jobs" in p], plans
    finally:
        jq.close()


@pytest.mark.parametrize(
    ("marker", "outcome"),
    [("SET status = 'running'", "start"), ("SET status = 'completed'", "complete"),
     ("AS failed(id", "fail")],
)  # fmt: skip
def test_a_holders_writes_never_walk_the_held_index(pg_url: str, marker: str, outcome: str) -> None:
    # The held index keeps entries of jobs held and since finished until a
    # vacuum; a completion whose plan walked it, joining every entry with
    # the batch, took 2 s in a drain. On a generic plan (what a prepared
    # statement may switch to) and on a custom one, the fenced writes reach
    # their rows through the primary key.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        jq.enqueue_many([("anything", {})] * 200)
        # Statistics from before any job was held (as after a fill): the
        # held index then looks empty to the planner, and cheap.
        sql(pg_url, "ANALYZE jobkeeper_jobs")
        register(jq)
        worker_backend = jq.backend.dedicated()  # type: ignore[attr-defined]
        try:
            for _ in range(RUNS):
                held = worker_backend.job_claim(worker_id=WORKER, queue="default", limit=10)
                claims = [Claim(j.id, WORKER, j.attempt, j.fence) for j in held]
                worker_backend.job_start_many(claims=claims[:5])
                worker_backend.job_complete_many(
                    completions=[Completion(c, None) for c in claims[:5]], delete=False
                )
                failure = Failure(claims[5], "retryable", error_entry(held[5], "boom", None))
                worker_backend.job_fail_many(failures=[failure])
            (name, parameter_types) = worker_backend._fetch_raw(
                "SELECT name, parameter_types::text FROM pg_prepared_statements "
                "WHERE statement LIKE %s",
                (f"%{marker}%",),
            )[0]
            arguments = ", ".join("NULL" for _ in parameter_types.strip("{}").split(","))
            for mode in ("force_generic_plan", "force_custom_plan"):
                worker_backend._fetch_raw(f"SET plan_cache_mode = {mode}")
                plan = worker_backend._fetch_raw(f"EXPLAIN EXECUTE {name}({arguments})")
                text = "\n".join(row[0] for row in plan)
                assert "jobkeeper_jobs_held_idx" not in text, (outcome, mode, text)
        finally:
            worker_backend.close()
    finally:
        jq.close()
