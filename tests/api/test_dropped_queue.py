"""A ``JobQueue`` dropped without ``close()`` lets go of its connections and
threads when it is collected. A break-test made a queue per request and
dropped it: each held 2 PostgreSQL sessions and 4 threads (SQLite: the file
and its -wal open) until the cycle collector ran, or for good with it off;
the shared server answered "too many clients". The queue was in a cycle of
its own (a closure of its periodics), and nothing closed its pool.

Runs with the cycle collector off: a queue with no tasks is freed by
reference counting alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import secrets
import time
from collections.abc import Callable, Iterator

import psycopg

from jobkeeper import JobQueue


@contextlib.contextmanager
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def eventually(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _use(jq: JobQueue) -> None:
    job = jq.enqueue("anything", {})
    asyncio.run(jq.enqueue_async("anything", {}))
    with contextlib.suppress(TimeoutError):
        jq.wait(job.id, timeout=0.05)


def test_a_dropped_postgres_queue_closes_its_sessions(pg_url: str) -> None:
    name = f"jk_dropped_{secrets.token_hex(4)}"
    JobQueue(pg_url).migrate()

    def sessions() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
        assert row is not None
        return int(row[0])

    with no_cycle_collector():
        jq = JobQueue(f"{pg_url}&application_name={name}")
        _use(jq)
        assert sessions() >= 1
        del jq
        assert eventually(lambda: sessions() == 0), f"{sessions()} sessions left open"


def test_a_dropped_sqlite_queue_closes_its_file(sqlite_url: str) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    JobQueue(sqlite_url).migrate()

    def open_files() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith(path):
                    found.append(target)
        return found

    with no_cycle_collector():
        jq = JobQueue(sqlite_url)
        _use(jq)
        assert open_files()
        del jq
        assert eventually(lambda: not open_files()), f"still open: {open_files()}"


def test_a_worker_of_a_dropped_queue_still_runs(pg_url: str, sqlite_url: str) -> None:
    # The worker's connections are its own (dedicated), not the queue's pool
    # that the release closes.
    for url in (pg_url, sqlite_url):
        JobQueue(url).migrate()
        with no_cycle_collector():
            worker = JobQueue(url).worker(["default"], burst=True)
            time.sleep(0.5)  # a release would have run by now
            stats = worker.run()
        assert stats.exit_code == 0
