"""Schema: migrate() is idempotent and safe concurrently; the PostgreSQL claim
query stays on its partial index however much history piles up.
"""

from __future__ import annotations

import logging
import secrets
import threading

import psycopg
import pytest

from jobkeeper import DatabaseError, JobQueue, JobStatus
from jobkeeper.backends.postgres.backend import MIGRATIONS as PG_MIGRATIONS
from jobkeeper.backends.postgres.backend import QUERIES as PG_QUERIES
from jobkeeper.backends.postgres.backend import PostgresBackend
from jobkeeper.backends.postgres.schema import migration_lock_key
from jobkeeper.backends.sqlite.backend import MIGRATIONS as SQLITE_MIGRATIONS
from support.db import PG_URL, count, migrate_to, pg_schema_url, sql
from support.waiting import wait_for

from .helpers import claim

TABLES = {
    "jobkeeper_jobs",
    "jobkeeper_dead_letters",
    "jobkeeper_workers",
    "jobkeeper_schema",
    "jobkeeper_leader",
    "jobkeeper_periodic",
    "jobkeeper_queues",
    "jobkeeper_queue_starts",
    "jobkeeper_installation",
}
#: The newest schema version; both backends number their migrations alike.
LATEST = PG_MIGRATIONS[-1][0]
assert [v for v, _ in PG_MIGRATIONS] == [v for v, _ in SQLITE_MIGRATIONS]


def tables(jq: JobQueue) -> set[str]:
    if jq.url.scheme == "postgresql":
        rows = sql(jq, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    else:
        rows = sql(jq, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return {row[0] for row in rows if str(row[0]).startswith("jobkeeper_")}


def test_migrate_is_idempotent(db_url):
    with JobQueue(db_url) as jq:
        assert jq.backend.schema_version() == 0
        assert jq.migrate() == LATEST
        job = jq.enqueue("t", {"keep": True})
        assert jq.migrate() == LATEST
        assert jq.migrate() == LATEST
        assert jq.backend.schema_version() == LATEST
        assert tables(jq) == TABLES
        assert count(jq, "jobkeeper_schema") == len(PG_MIGRATIONS)
        kept = jq.get_job(job.id)
        assert kept is not None and kept.args == {"keep": True}


def test_migrate_from_version_1_keeps_jobs_and_workers(db_url, monkeypatch):
    # A database at version 1 with a registered worker holding a job: version
    # 2 adds the workers' declared rescue_after, NULL for existing rows.
    with JobQueue(db_url) as jq:
        migrate_to(jq, 1, monkeypatch)
        now = "now()" if jq.url.scheme == "postgresql" else "0"
        queues = "'[\"default\"]'" + ("::jsonb" if jq.url.scheme == "postgresql" else "")
        sql(
            jq,
            "INSERT INTO jobkeeper_workers (id, hostname, pid, queues, started_at, heartbeat_at) "
            f"VALUES ('old:1:aaaa', 'h', 1, {queues}, {now}, {now})",
        )
        # Claimed by a version-1 worker: running, attempt counted. (Written
        # by hand: this code's enqueue names the version 3 unique index.)
        sql(
            jq,
            "INSERT INTO jobkeeper_jobs (queue, task, args, status, attempt, worker_id) "
            "VALUES ('default', 't', '{\"keep\": true}', 'running', 1, 'old:1:aaaa')",
        )
        (job_id,) = sql(jq, "SELECT id FROM jobkeeper_jobs")[0]
        # A new worker (or `status`) before the upgrade says what to do.
        with pytest.raises(DatabaseError, match=r"run `jobkeeper --database .+ migrate`"):
            jq.workers()
        assert jq.migrate() == LATEST
        (worker,) = jq.workers()
        assert (worker.id, worker.rescue_after) == ("old:1:aaaa", None)
        kept = jq.get_job(job_id)
        assert kept is not None and kept.worker_id == "old:1:aaaa" and kept.args == {"keep": True}
        assert (kept.status, kept.attempt, kept.fence) == (JobStatus.RUNNING, 1, 0)


def schema_of(jq: JobQueue) -> list[tuple[object, ...]]:
    """Tables, columns, constraints and indexes of the jobkeeper tables."""
    if jq.url.scheme == "postgresql":
        columns = sql(
            jq,
            "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
            "column_default FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY 1, 3",
        )
        constraints = sql(
            jq,
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
            "FROM pg_constraint WHERE connamespace = current_schema()::regnamespace "
            "ORDER BY 1, 2",
        )
        indexes = sql(
            jq,
            "SELECT indexname, replace(indexdef, current_schema() || '.', '') FROM pg_indexes "
            "WHERE schemaname = current_schema() ORDER BY 1",
        )
        return [*columns, *constraints, *indexes]
    rows = sql(
        jq,
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE name LIKE 'jobkeeper%' ORDER BY name",
    )
    # A renamed table's statement names it quoted; the text is otherwise the same.
    return [
        (t, n, tbl, str(q).replace('"jobkeeper_jobs"', "jobkeeper_jobs")) for t, n, tbl, q in rows
    ]


def test_migrate_from_version_2_keeps_jobs_ids_and_equals_a_fresh_schema(
    db_url, tmp_path, monkeypatch
):
    # Version 3 adds the claimed status, fence and unstarted_returns; SQLite
    # rebuilds the jobs table for the new CHECKs. Rows, the unique key and
    # the id sequence (past the largest id left: pruned jobs) must survive.
    with JobQueue(db_url) as jq:
        migrate_to(jq, 2, monkeypatch)
        # Rows as a version-2 worker leaves them (written by hand: this
        # code's enqueue names the version 3 unique index): one running, two
        # available, and the id sequence past the largest id left (pruned).
        insert = (
            "INSERT INTO jobkeeper_jobs (id, queue, task, args, status, attempt, worker_id, "
            "unique_key) VALUES "
        )
        sql(jq, insert + "(1, 'default', 't', '{}', 'running', 1, 'w', NULL)")
        sql(jq, insert + "(2, 'default', 't', '{}', 'available', 0, NULL, NULL)")
        sql(jq, insert + "(3, 'default', 't', '{}', 'available', 0, NULL, 'k')")
        sql(jq, insert + "(9, 'default', 't', '{}', 'available', 0, NULL, NULL)")
        sql(jq, "DELETE FROM jobkeeper_jobs WHERE id = 9")
        if jq.url.scheme == "postgresql":
            sql(jq, "SELECT setval(pg_get_serial_sequence('jobkeeper_jobs', 'id'), 9)")
        assert jq.migrate() == LATEST
        held = jq.get_job(1)
        assert held is not None
        assert (held.status, held.worker_id, held.attempt, held.fence) == (
            JobStatus.RUNNING, "w", 1, 0
        )  # fmt: skip
        available = [jq.get_job(i) for i in (2, 3)]
        assert [j.status for j in available if j] == [JobStatus.AVAILABLE] * 2
        assert jq.enqueue("t", {}).id > 9  # ids are never reused
        assert jq.enqueue("t", {}, unique_key="k").id == 3
        (claimed,) = claim(jq, limit=1)
        assert (claimed.id, claimed.status, claimed.fence) == (2, JobStatus.CLAIMED, 1)
        migrated = schema_of(jq)
    if db_url.startswith("sqlite"):
        with JobQueue(f"sqlite:///{tmp_path / 'fresh.db'}") as fresh:
            fresh.migrate()
            assert schema_of(fresh) == migrated
        return
    # A second, fresh schema on the same server.
    schema = f"jk_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        with JobQueue(pg_schema_url(schema)) as fresh:
            fresh.migrate()
            assert schema_of(fresh) == migrated
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_migrate_from_four_threads_at_once(db_url):
    queues = [JobQueue(db_url) for _ in range(4)]
    barrier = threading.Barrier(4)
    versions: list[int] = []
    errors: list[BaseException] = []

    def run(jq: JobQueue) -> None:
        try:
            barrier.wait()
            versions.append(jq.migrate())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(jq,)) for jq in queues]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert versions == [LATEST] * 4
        jq = queues[0]
        assert tables(jq) == TABLES
        assert count(jq, "jobkeeper_schema") == len(PG_MIGRATIONS)
        jq.enqueue("t", {})
        assert len(claim(jq)) == 1
    finally:
        for jq in queues:
            jq.close()


def test_postgres_migrates_that_waited_on_the_schemas_creation_do_not_warn(pg_url, caplog):
    # They met the retired index the creating migrate had not dropped yet and
    # warned that its drop waits for open transactions (break-test 74, after
    # 2c7ff99): 4 of 6 runs. The migration lock is held until all four wait
    # on it, so each read the version before any schema existed.
    name = f"jk-test-migrate-{secrets.token_hex(4)}"
    backends = [
        PostgresBackend(JobQueue(pg_url).url, dedicated=True, application_name=name)
        for _ in range(4)
    ]
    versions: list[int] = []
    errors: list[BaseException] = []

    def run(backend: PostgresBackend) -> None:
        try:
            versions.append(backend.migrate())
        except BaseException as exc:
            errors.append(exc)

    waiting = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = %s AND wait_event_type = 'Lock'"
    )
    holder = psycopg.connect(pg_url, autocommit=True)
    key = migration_lock_key(holder.execute("SELECT current_schema()").fetchone()[0])
    threads = [threading.Thread(target=run, args=(backend,)) for backend in backends]
    try:
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        for thread in threads:
            thread.start()
        wait_for(
            lambda: holder.execute(waiting, (name,)).fetchone() == (4,),
            what="four migrates waiting on the migration lock",
        )
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
        for thread in threads:
            thread.join(60)
        assert errors == [] and versions == [LATEST] * 4
        warned = [
            r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.WARNING and "dropping index" in r.getMessage()
        ]
        assert warned == []
    finally:
        holder.close()
        for backend in backends:
            backend.close()


def _pg_plan(jq: JobQueue, query: str, params: dict[str, object]) -> str:
    """EXPLAIN of the named PostgreSQL query with ``params`` bound client-side."""
    with (
        psycopg.connect(jq.url.url, autocommit=True) as conn,
        psycopg.ClientCursor(conn) as cursor,
    ):
        cursor.execute("EXPLAIN " + PG_QUERIES[query], params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_postgres_claim_uses_the_claim_index_not_a_seq_scan(pg_url):
    with JobQueue(pg_url) as jq:
        jq.migrate()
        sql(
            jq,
            "INSERT INTO jobkeeper_jobs (queue, task, status, finished_at) "
            "SELECT 'default', 't', 'completed', now() FROM generate_series(1, 20000)",
        )
        sql(
            jq,
            "INSERT INTO jobkeeper_dead_letters (id, queue, task, args, priority, attempt, "
            "max_attempts, scheduled_at, created_at, finished_at, errors, reason) "
            "SELECT 1000000 + g, 'default', 't', '{}', 0, 20, 20, now(), now(), now(), '[]', 'x' "
            "FROM generate_series(1, 5000) AS g",
        )
        jq.enqueue_many([("t", {"i": i}) for i in range(20)])
        sql(jq, "ANALYZE jobkeeper_jobs")
        plan = _pg_plan(jq, "job_claim", {"queue": "default", "limit": 10, "worker_id": "w"})
        assert "jobkeeper_jobs_claim_idx" in plan, plan
        assert "Seq Scan on jobkeeper_jobs" not in plan, plan
        assert len(claim(jq, limit=10)) == 10


def _finished_and_pending(jq: JobQueue, insert_finished: str) -> None:
    sql(jq, insert_finished)
    jq.enqueue_many([("t", {"i": i}) for i in range(20)])
    jq.enqueue("t", {}, queue="lim", delay=3600)


def test_postgres_max_pending_count_reads_only_pending_rows(pg_url):
    # One condition naming the four pending statuses matches no partial
    # index: its plan scanned every finished row on each enqueue into a
    # limited queue (30 ms beside 60,000 of them, the queue's row locked).
    with JobQueue(pg_url) as jq:
        jq.migrate()
        _finished_and_pending(
            jq,
            "INSERT INTO jobkeeper_jobs (queue, task, status, finished_at) "
            "SELECT 'lim', 't', 'completed', now() FROM generate_series(1, 20000)",
        )
        sql(jq, "ANALYZE jobkeeper_jobs")
        params = {"queues": ["lim", "default"]}
        plan = _pg_plan(jq, "job_insert_many_count_pending", params)
        query = PG_QUERIES["job_insert_many_count_pending"]
        counted = sorted(jq.backend._fetch_raw(query, params))  # type: ignore[attr-defined]
        assert "Seq Scan on jobkeeper_jobs" not in plan, plan
        assert counted == [("default", 20), ("lim", 1)]


def test_sqlite_max_pending_count_reads_only_pending_rows(tmp_path):
    from jobkeeper.backends.sqlite.queries import QUERIES as SQLITE_QUERIES

    with JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}") as jq:
        jq.migrate()
        _finished_and_pending(
            jq,
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 20000) "
            "INSERT INTO jobkeeper_jobs (queue, task, args, status, finished_at, scheduled_at, "
            "created_at) SELECT 'lim', 't', '{}', 'completed', 1, 1, 1 FROM g",
        )
        sql(jq, "ANALYZE")
        query = SQLITE_QUERIES["job_insert_many_count_pending"]
        params = {"queues": '["lim", "default"]'}
        plan = "\n".join(
            row[-1]
            for row in sql(
                jq, "EXPLAIN QUERY PLAN " + query.replace(":queues", "?"), (params["queues"],) * 3
            )
        )
        counted = sorted(sql(jq, query.replace(":queues", "?"), (params["queues"],) * 3))
    assert "SCAN jobkeeper_jobs\n" not in plan + "\n", plan
    assert all("USING INDEX" in line for line in plan.splitlines() if "jobkeeper_jobs" in line)
    assert counted == [("default", 20), ("lim", 1)]


def test_a_search_path_naming_no_schema_says_so_when_migrating(pg_url):
    # helper-85: "PostgreSQL error: no schema has been selected to create in",
    # naming neither the search_path nor the schema.
    from urllib.parse import quote

    url = pg_url.split("?", 1)[0] + "?options=" + quote("-c search_path=no_such_schema_here")
    with JobQueue(url) as jq, pytest.raises(DatabaseError) as refused:
        jq.migrate()
    message = str(refused.value)
    assert "no schema of the search_path exists" in message and "CREATE SCHEMA" in message
    assert "no_such_schema_here" in message  # in the URL it names
