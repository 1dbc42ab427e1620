"""How fast each dashboard page (and /metrics) answers over a big table.

Fills a fresh database with N completed jobs (default 1,000,000; one bulk
INSERT ... SELECT, finished over the last 24 hours as retention keeps them),
an available backlog (``--available``, default 100,000, another bulk insert:
three queues, three priorities, due over the last hour, no worker to take
them), plus a live part (available, scheduled, retryable, running),
cancelled jobs and dead letters in three queues, then times every page through
Starlette's TestClient (the app's own time, no network): the median of
``--repeat`` requests after one warm-up. Issue 15 asks for every page under
200 ms at 1,000,000 completed rows.

    .venv/bin/python benchmarks/dashboard_pages.py --rows 100000
    .venv/bin/python benchmarks/dashboard_pages.py --backend postgres   # 1,000,000 rows
    .venv/bin/python benchmarks/dashboard_pages.py --rows 400000 --available 600000

PostgreSQL gets a schema of its own on ``--pg-url`` (dropped after);
SQLite a temporary file. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import psycopg

from benchmarks.harness import scratch_database
from jobkeeper import JobQueue

DEFAULT_PG_URL = os.environ.get(
    "JOBKEEPER_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
QUEUES = ("default", "emails", "reports")

PG_FILL = """
INSERT INTO jobkeeper_jobs (queue, task, args, status, attempt, scheduled_at, created_at,
                            attempted_at, finished_at, result)
SELECT (ARRAY['default', 'emails', 'reports'])[1 + n %% 3], 'task_' || (n %% 7),
       json_build_object('n', n), 'completed', 1,
       now() - make_interval(secs => 86400.0 * (%(rows)s - n) / %(rows)s),
       now() - make_interval(secs => 86400.0 * (%(rows)s - n) / %(rows)s),
       now() - make_interval(secs => 86400.0 * (%(rows)s - n) / %(rows)s),
       now() - make_interval(secs => 86400.0 * (%(rows)s - n) / %(rows)s) + interval '1 second',
       '{"ok": true}'
FROM generate_series(1, %(rows)s) AS n
"""
SQLITE_FILL = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows),
     clock(now) AS (SELECT (julianday('now') - 2440587.5) * 86400.0)
INSERT INTO jobkeeper_jobs (queue, task, args, status, attempt, scheduled_at, created_at,
                            attempted_at, finished_at, result)
SELECT CASE i % 3 WHEN 0 THEN 'reports' WHEN 1 THEN 'default' ELSE 'emails' END,
       'task_' || (i % 7), json_object('n', i), 'completed', 1,
       now - 86400.0 * (:rows - i) / :rows, now - 86400.0 * (:rows - i) / :rows,
       now - 86400.0 * (:rows - i) / :rows, now - 86400.0 * (:rows - i) / :rows + 1,
       '{"ok": true}'
FROM n, clock
"""
PG_FILL_AVAILABLE = """
INSERT INTO jobkeeper_jobs (queue, task, args, status, priority, scheduled_at, created_at)
SELECT (ARRAY['default', 'emails', 'reports'])[1 + n %% 3], 'task_' || (n %% 7),
       json_build_object('n', n), 'available', (ARRAY[0, 0, 0, 0, -1, 5])[1 + n %% 6],
       now() - make_interval(secs => 3600.0 * (%(rows)s - n) / %(rows)s),
       now() - make_interval(secs => 3600.0 * (%(rows)s - n) / %(rows)s)
FROM generate_series(1, %(rows)s) AS n
"""
SQLITE_FILL_AVAILABLE = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows),
     clock(now) AS (SELECT (julianday('now') - 2440587.5) * 86400.0)
INSERT INTO jobkeeper_jobs (queue, task, args, status, priority, scheduled_at, created_at)
SELECT CASE i % 3 WHEN 0 THEN 'reports' WHEN 1 THEN 'default' ELSE 'emails' END,
       'task_' || (i % 7), json_object('n', i), 'available',
       CASE i % 6 WHEN 4 THEN -1 WHEN 5 THEN 5 ELSE 0 END,
       now - 3600.0 * (:rows - i) / :rows, now - 3600.0 * (:rows - i) / :rows
FROM n, clock
"""


def fill(jq: JobQueue, rows: int, available: int) -> dict[str, int]:
    """The big table and backlog, then the live jobs the pages link to."""
    started = time.perf_counter()
    if jq.backend.name == "postgresql":
        with psycopg.connect(jq.url.url, autocommit=True) as conn:
            conn.execute(PG_FILL, {"rows": rows})
            if available:
                conn.execute(PG_FILL_AVAILABLE, {"rows": available})
    else:
        import sqlite3

        conn = sqlite3.connect(jq.url.path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(SQLITE_FILL, {"rows": rows})
        if available:
            conn.execute(SQLITE_FILL_AVAILABLE, {"rows": available})
        conn.execute("COMMIT")
        conn.close()
    filled = time.perf_counter() - started
    # The live part, through the API: 3,000 available, 300 scheduled.
    jq.enqueue_many([("send", {"i": i}, {"queue": QUEUES[i % 3]}) for i in range(3000)])
    jq.enqueue_many([("later", {"i": i}, {"delay": 3600}) for i in range(300)])
    from jobkeeper.models import Failure
    from jobkeeper.outcomes import claim_of

    worker = "bench-worker"
    claimed = jq.backend.job_claim(worker_id=worker, queue="reports", limit=120)
    dead = [Failure(claim_of(j), "dead", '{"error": "boom"}') for j in claimed[:100]]
    retry = [
        Failure(claim_of(j), "retryable", '{"error": "flaky"}', retry_in=600) for j in claimed[100:]
    ]
    jq.backend.job_fail_many(failures=dead + retry)
    jq.backend.job_claim(worker_id=worker, queue="emails", limit=20)
    if jq.backend.name == "postgresql":
        # What autovacuum (or, with it off, jobkeeper's pruner) does soon
        # after a bulk load: statistics for the planner, a visibility map.
        with psycopg.connect(jq.url.url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE jobkeeper_jobs")
            conn.execute("VACUUM ANALYZE jobkeeper_dead_letters")
    middle = rows // 2
    return {"fill_seconds": round(filled, 1), "middle_id": middle, "live_id": rows + available + 10}


def time_pages(jq: JobQueue, repeat: int, ids: dict[str, int]) -> list[tuple[str, float, float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from starlette.testclient import TestClient

    from jobkeeper.dashboard import create_app

    client = TestClient(create_app(jq, password=""))
    pages = [
        "/",
        "/jobs",
        "/jobs?status=completed",
        "/jobs?status=available",
        "/jobs?status=retryable",
        "/jobs?queue=emails",
        "/jobs?task=task_3",
        f"/jobs?before={ids['middle_id']}",
        f"/jobs?status=completed&before={ids['middle_id']}",
        f"/jobs/{ids['middle_id']}",
        f"/jobs/{ids['live_id']}",
        "/dead",
        "/workers",
        "/queues",
        "/periodic",
        "/metrics",
    ]
    results = []
    for page in pages:
        response = client.get(page)  # warm-up (and a check)
        if response.status_code != 200:
            raise SystemExit(f"{page}: HTTP {response.status_code}: {response.text[:200]}")
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            client.get(page)
            times.append((time.perf_counter() - started) * 1000)
        results.append((page, statistics.median(times), max(times)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="completed rows")
    parser.add_argument(
        "--available", type=int, default=100_000, help="available backlog rows (no worker)"
    )
    parser.add_argument("--backend", choices=["postgres", "sqlite", "all"], default="all")
    parser.add_argument("--repeat", type=int, default=7, help="timed requests per page")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    args = parser.parse_args()
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]
    for backend in backends:
        with scratch_database(backend, args.pg_url) as url:
            jq = JobQueue(url)
            jq.migrate()
            try:
                ids = fill(jq, args.rows, args.available)
                print(
                    f"\n{backend}: {args.rows:,} completed rows, {args.available:,} available "
                    f"(+3,400 live, 100 dead), "
                    f"filled in {ids['fill_seconds']} s; median of {args.repeat} requests"
                )
                print(f"  {'page':<42} {'median ms':>10} {'max ms':>8}")
                for page, median, worst in time_pages(jq, args.repeat, ids):
                    flag = "  over 200 ms" if median > 200 else ""
                    print(f"  {page:<42} {median:>10.1f} {worst:>8.1f}{flag}")
            finally:
                jq.close()


if __name__ == "__main__":
    main()
