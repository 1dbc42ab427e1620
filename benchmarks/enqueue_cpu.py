"""Python CPU per enqueue on PostgreSQL: what the client spends, not the server.

Wall time on a shared machine mixes in the server's share and the other
load; process CPU time (every thread of this process) is what jobkeeper
itself costs per call. Prints, in microseconds of CPU: the sync single
enqueue, the async single enqueue, the bulk enqueue per row, and the same
work done in plain psycopg (the one-row INSERT jobkeeper prepares, and a
COPY of the bulk's rows into ``jobkeeper_jobs``) as the floor. Each figure
is the least of ``--rounds`` rounds: other load on the machine only adds.

    .venv/bin/python -m benchmarks.enqueue_cpu --pg-url postgresql://.../db
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import psycopg

from jobkeeper import JobQueue

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _cpu_us(run: Callable[[], None], calls: int) -> float:
    started = time.process_time()
    run()
    return (time.process_time() - started) / calls * 1e6


def _queue(url: str) -> JobQueue:
    queue = JobQueue(url)

    @queue.task
    def noop() -> None:
        return None

    return queue


def single(url: str, n: int) -> float:
    queue = _queue(url)
    try:
        for _ in range(50):
            queue.enqueue("noop", {})  # opens the pool, prepares the statement

        def run() -> None:
            for _ in range(n):
                queue.enqueue("noop", {})

        return _cpu_us(run, n)
    finally:
        queue.close()


def single_async(url: str, n: int) -> float:
    queue = _queue(url)

    async def main() -> float:
        try:
            for _ in range(50):
                await queue.enqueue_async("noop", {})
            started = time.process_time()
            for _ in range(n):
                await queue.enqueue_async("noop", {})
            return (time.process_time() - started) / n * 1e6
        finally:
            await queue.aclose()

    try:
        return asyncio.run(main())
    finally:
        queue.close()


def bulk(url: str, batches: int, size: int) -> float:
    queue = _queue(url)
    try:
        queue.enqueue_many([("noop", {})] * size)

        def run() -> None:
            for _ in range(batches):
                queue.enqueue_many([("noop", {})] * size)

        return _cpu_us(run, batches * size)
    finally:
        queue.close()


def raw_single(url: str, n: int) -> float:
    """The one-row INSERT in plain psycopg, prepared, autocommit."""
    sql = (
        "INSERT INTO jobkeeper_jobs (queue, task, args, priority, max_attempts) "
        "VALUES (%s, %s, %s::json, %s, %s) RETURNING id, status, scheduled_at, created_at"
    )
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        for _ in range(50):
            cursor.execute(sql, ("default", "noop", "{}", 0, 20), prepare=True)

        def run() -> None:
            for _ in range(n):
                cursor.execute(sql, ("default", "noop", "{}", 0, 20), prepare=True)
                cursor.fetchone()

        return _cpu_us(run, n)


def raw_copy(url: str, batches: int, size: int) -> float:
    """A COPY of ``size`` rows per transaction into ``jobkeeper_jobs``."""
    sql = "COPY jobkeeper_jobs (queue, task, args, priority, max_attempts) FROM STDIN"
    with psycopg.connect(url, autocommit=True) as conn:

        def run() -> None:
            for _ in range(batches):
                with conn.transaction(), conn.cursor() as cursor, cursor.copy(sql) as copy:
                    for _ in range(size):
                        copy.write_row(("default", "noop", "{}", 0, 20))

        return _cpu_us(run, batches * size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_URL)
    parser.add_argument("--single", type=int, default=3000, help="single enqueues per figure")
    parser.add_argument("--batches", type=int, default=20, help="bulk calls per figure")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per bulk call")
    parser.add_argument("--only", default="", help="comma-separated figure names")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure (min shown)")
    args = parser.parse_args()
    JobQueue(args.pg_url).migrate()
    figures: dict[str, Callable[[], float]] = {
        "sync_single": lambda: single(args.pg_url, args.single),
        "async_single": lambda: single_async(args.pg_url, args.single),
        "bulk_per_row": lambda: bulk(args.pg_url, args.batches, args.batch),
        "raw_insert_single": lambda: raw_single(args.pg_url, args.single),
        "raw_copy_per_row": lambda: raw_copy(args.pg_url, args.batches, args.batch),
    }
    only = {name for name in args.only.split(",") if name}
    for name, measure in figures.items():
        if not only or name in only:
            rounds = sorted(measure() for _ in range(args.rounds))
            print(
                f"{name:20} {rounds[0]:8.1f} us CPU per call/row (rounds: "
                + ", ".join(f"{r:.1f}" for r in rounds)
                + ")",
                flush=True,
            )


if __name__ == "__main__":
    main()
