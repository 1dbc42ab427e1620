"""The probe of a worker's many queues (``queues_with_available``) is one
index probe of the claim index per queue, never a scan of the jobs: asked
every pass, it must cost what the claims of empty queues it replaces did.
"""

from __future__ import annotations

import json

import psycopg

from jobkeeper import JobQueue
from jobkeeper.backends.postgres.backend import QUERIES as PG_QUERIES
from jobkeeper.backends.sqlite.queries import QUERIES as SQLITE_QUERIES
from support.db import sql

NAMES = [f"q{i}" for i in range(500)] + ["busy"]


def test_postgres_probe_is_an_index_probe_per_queue(pg_url):
    with JobQueue(pg_url) as jq:
        jq.migrate()
        # One queue of many available jobs (one batch: one scheduled_at), a
        # few thin ones, finished rows: per queue the planner expects
        # thousands of available rows, and without the claim order it walked
        # the table for each name (35 s for 501 names over 200,000 rows,
        # against 2 ms).
        sql(
            jq,
            "INSERT INTO jobkeeper_jobs (queue, task, status, finished_at, scheduled_at) "
            "SELECT CASE WHEN mod(i, 1000) = 0 THEN 'q' || (i / 1000) ELSE 'busy' END, 't', "
            "CASE WHEN mod(i, 3) = 0 THEN 'completed' ELSE 'available' END, "
            "CASE WHEN mod(i, 3) = 0 THEN now() END, now() FROM generate_series(1, 200000) AS i",
        )
        sql(jq, "ANALYZE jobkeeper_jobs")
        with (
            psycopg.connect(jq.url.url, autocommit=True) as conn,
            psycopg.ClientCursor(conn) as cursor,
        ):
            cursor.execute("EXPLAIN " + PG_QUERIES["queues_with_available"], {"queues": NAMES})
            plan = "\n".join(row[0] for row in cursor.fetchall())
        found = jq.backend.queues_with_available(queues=NAMES)
    assert "Seq Scan on jobkeeper_jobs" not in plan, plan
    assert "jobkeeper_jobs_claim_idx" in plan, plan
    thin = [f"q{i}" for i in range(1, 201) if i % 3]  # q(i/1000) of i = 1000, 2000...
    assert found == [*thin, "busy"]


def test_sqlite_probe_is_an_index_probe_per_queue(tmp_path):
    with JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}") as jq:
        jq.migrate()
        query = SQLITE_QUERIES["queues_with_available"].replace(":queues", "?")
        rows = sql(jq, "EXPLAIN QUERY PLAN " + query, (json.dumps(NAMES),))
    plan = "\n".join(row[-1] for row in rows)
    assert "USING INDEX jobkeeper_jobs_claim_idx" in plan, plan
    assert all("USING INDEX" in line for line in plan.splitlines() if " job " in f" {line} ")
