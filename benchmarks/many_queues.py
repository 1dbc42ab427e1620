"""What serving many queues costs a worker: a drain, and an idle worker's transactions.

Fills a fresh database with ``--jobs`` jobs of a no-op task in one queue
(default 20,000) and times an in-process burst worker
(``run_worker(burst=True)``, ``--concurrency`` threads) draining them while
it serves that queue alone, then while it serves it among ``--queues`` queues
(default 500; the others empty). On PostgreSQL it then runs an idle worker of
one queue and of ``--queues`` queues for ``--idle`` seconds each and counts
the database's committed transactions meanwhile (``xact_commit`` of
``pg_stat_database``: use a database nothing else uses, or the figure counts
the others too). Figures are printed, never asserted.

    .venv/bin/python benchmarks/many_queues.py --backend sqlite
    .venv/bin/python benchmarks/many_queues.py --pg-url postgresql://postgres@127.0.0.1:5432/mine

PostgreSQL gets a schema of its own on ``--pg-url`` (dropped after); SQLite a
temporary file.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

import psycopg

from benchmarks.dashboard_pages import DEFAULT_PG_URL
from benchmarks.harness import scratch_database
from jobkeeper import JobQueue

#: The queue that holds the jobs, last of the worker's queues.
BUSY = "work"
#: Seconds an idle worker runs before its transactions are counted (start-up
#: writes: registration, the first staging, the leader's election).
IDLE_WARMUP = 3.0


def served(queues: int) -> list[str]:
    return [f"empty{i}" for i in range(queues - 1)] + [BUSY]


def drain(url: str, jobs: int, queues: int, concurrency: int) -> float:
    """Seconds a burst worker of ``queues`` queues takes to run ``jobs`` jobs."""
    with JobQueue(url, poll_interval=0.5) as jq:

        @jq.task(queue=BUSY)
        def noop() -> None:
            pass

        for start in range(0, jobs, 5_000):
            jq.enqueue_many([(noop, {})] * min(5_000, jobs - start))
        started = time.perf_counter()
        jq.run_worker(queues=served(queues), concurrency=concurrency, burst=True)
        took = time.perf_counter() - started
        completed = jq.stats()[BUSY]["completed"]
        if completed != jobs:
            raise SystemExit(f"the worker completed {completed} jobs of {jobs}")
        return took


def xact_commit(pg_url: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def idle_rate(url: str, pg_url: str, queues: int, seconds: float) -> float:
    """Transactions a second the database commits while an idle worker of
    ``queues`` queues runs (the counting's own few included).
    """
    with JobQueue(url) as jq:
        worker = jq.worker(queues=served(queues), concurrency=4)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            time.sleep(IDLE_WARMUP)
            before = xact_commit(pg_url)
            time.sleep(seconds)
            after = xact_commit(pg_url)
        finally:
            worker.stop()
            thread.join(60)
    return (after - before) / seconds


def migrate(url: str) -> None:
    with JobQueue(url) as jq:
        jq.migrate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--queues", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds (PostgreSQL)")
    args = parser.parse_args()
    # Not the warning, per queue, that no task of this app uses it.
    logging.getLogger("jobkeeper").setLevel(logging.ERROR)
    print(f"{args.backend}: {args.jobs:,} jobs in one queue, concurrency {args.concurrency}")
    for queues in (1, args.queues):
        with scratch_database(args.backend, args.pg_url) as url:
            migrate(url)
            took = drain(url, args.jobs, queues, args.concurrency)
        print(f"  drain, serving {queues:>5} queues: {took:7.2f} s")
    if args.backend != "postgres":
        return
    for queues in (1, args.queues):
        with scratch_database(args.backend, args.pg_url) as url:
            migrate(url)
            rate = idle_rate(url, args.pg_url, queues, args.idle)
        print(f"  idle, serving {queues:>5} queues: {rate:7.1f} transactions/s")


if __name__ == "__main__":
    main()
