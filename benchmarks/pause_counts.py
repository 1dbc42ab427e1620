"""How long ``jq.pause()`` / ``jq.resume()`` take beside another queue's backlog.

Fills a fresh database with ``--available`` available jobs in the queue
``backlog`` (default 300,000), ``--paused-jobs`` in the queue ``paused``
(default 1,000) and ``--finished`` completed jobs spread over both (default
0), then pauses and resumes ``paused`` ``--repeat`` times each, and times
``jq.queues(recount=False)`` (every queue's counts, what pause counted up to
0.4.x) beside them. The median and the slowest of each are printed, never
asserted.

    .venv/bin/python benchmarks/pause_counts.py                      # PostgreSQL
    .venv/bin/python benchmarks/pause_counts.py --backend sqlite --available 600000

PostgreSQL gets a schema of its own on ``--pg-url`` (dropped after); SQLite a
temporary file.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from benchmarks.dashboard_pages import DEFAULT_PG_URL
from benchmarks.harness import scratch_database
from jobkeeper import JobQueue

PG_FILL = """
INSERT INTO jobkeeper_jobs (queue, task, args, status, priority, scheduled_at, created_at,
                            attempt, finished_at)
SELECT %(queue)s, 't', json_build_object('n', n), %(status)s, n %% 3,
       now() - make_interval(secs => n / 100.0), now() - make_interval(secs => n / 100.0),
       CASE WHEN %(status)s = 'completed' THEN 1 ELSE 0 END,
       CASE WHEN %(status)s = 'completed' THEN now() - make_interval(secs => n / 100.0) END
FROM generate_series(1, %(rows)s) AS n
"""
SQLITE_FILL = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows),
     clock(now) AS (SELECT (julianday('now') - 2440587.5) * 86400.0)
INSERT INTO jobkeeper_jobs (queue, task, args, status, priority, scheduled_at, created_at,
                            attempt, finished_at)
SELECT :queue, 't', json_object('n', i), :status, i % 3, now - i / 100.0, now - i / 100.0,
       CASE WHEN :status = 'completed' THEN 1 ELSE 0 END,
       CASE WHEN :status = 'completed' THEN now - i / 100.0 END
FROM n, clock
"""


def fill(jq: JobQueue, queue: str, status: str, rows: int) -> None:
    if not rows:
        return
    params = {"queue": queue, "status": status, "rows": rows}
    if jq.backend.name == "postgresql":
        jq.backend._fetch_raw(PG_FILL, params)
        jq.backend._fetch_raw("ANALYZE jobkeeper_jobs")
    else:
        jq.backend._conn().execute(SQLITE_FILL, params)
        jq.backend._conn().execute("ANALYZE")


def timed(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    call()  # warm-up
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000, max(took) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--available", type=int, default=300_000)
    parser.add_argument("--paused-jobs", type=int, default=1_000)
    parser.add_argument("--finished", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    with scratch_database(args.backend, args.pg_url) as url, JobQueue(url) as jq:
        jq.migrate()
        fill(jq, "backlog", "available", args.available)
        fill(jq, "paused", "available", args.paused_jobs)
        fill(jq, "backlog", "completed", args.finished // 2)
        fill(jq, "paused", "completed", args.finished - args.finished // 2)
        print(
            f"{args.backend}: {args.available:,} available in 'backlog', "
            f"{args.paused_jobs:,} in 'paused', {args.finished:,} completed; "
            f"median / slowest of {args.repeat}"
        )
        for label, call in (
            ("pause('paused')", lambda: jq.pause("paused")),
            ("resume('paused')", lambda: jq.resume("paused")),
            ("queues(recount=False)", lambda: jq.queues(recount=False)),
        ):
            median, slowest = timed(call, args.repeat)
            print(f"  {label:<24} {median:8.1f} ms {slowest:8.1f} ms")


if __name__ == "__main__":
    main()
