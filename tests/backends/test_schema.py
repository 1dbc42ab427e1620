"""Schema: migrate() is idempotent and safe concurrently; the PostgreSQL claim
query stays on its partial index however much history piles up.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from jobkeeper import DatabaseError, JobQueue
from jobkeeper.backends.postgres.backend import MIGRATIONS as PG_MIGRATIONS
from jobkeeper.backends.postgres.backend import QUERIES as PG_QUERIES
from jobkeeper.backends.sqlite.backend import MIGRATIONS as SQLITE_MIGRATIONS

from .helpers import claim, count, sql

TABLES = {
    "jobkeeper_jobs",
    "jobkeeper_dead_letters",
    "jobkeeper_workers",
    "jobkeeper_schema",
    "jobkeeper_leader",
    "jobkeeper_periodic",
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


def test_migrate_from_version_1_keeps_jobs_and_workers(db_url):
    # A database at version 1 with a registered worker holding a job: version
    # 2 adds the workers' declared rescue_after, NULL for existing rows.
    with JobQueue(db_url) as jq:
        jq.migrate()
        sql(jq, "DROP TABLE jobkeeper_leader")
        sql(jq, "DROP TABLE jobkeeper_periodic")
        sql(jq, "ALTER TABLE jobkeeper_workers DROP COLUMN rescue_after")
        sql(jq, "DELETE FROM jobkeeper_schema WHERE version >= 2")
        assert jq.backend.schema_version() == 1
        now = "now()" if jq.url.scheme == "postgresql" else "0"
        queues = "'[\"default\"]'" + ("::jsonb" if jq.url.scheme == "postgresql" else "")
        sql(
            jq,
            "INSERT INTO jobkeeper_workers (id, hostname, pid, queues, started_at, heartbeat_at) "
            f"VALUES ('old:1:aaaa', 'h', 1, {queues}, {now}, {now})",
        )
        job = jq.enqueue("t", {"keep": True})
        (held,) = jq.backend.job_claim(worker_id="old:1:aaaa", queue="default", limit=1)
        # A new worker (or `status`) before the upgrade says what to do.
        with pytest.raises(DatabaseError, match="run `jobkeeper migrate`"):
            jq.workers()
        assert jq.migrate() == LATEST
        (worker,) = jq.workers()
        assert (worker.id, worker.rescue_after) == ("old:1:aaaa", None)
        kept = jq.get_job(job.id)
        assert kept is not None and kept.worker_id == held.worker_id == "old:1:aaaa"


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
        with (
            psycopg.connect(jq.url.url, autocommit=True) as conn,
            psycopg.ClientCursor(conn) as cursor,
        ):
            cursor.execute(
                "EXPLAIN " + PG_QUERIES["job_claim"],
                {"queue": "default", "limit": 10, "worker_id": "w"},
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "jobkeeper_jobs_claim_idx" in plan, plan
        assert "Seq Scan on jobkeeper_jobs" not in plan, plan
        assert len(claim(jq, limit=10)) == 10
