"""The raw limit: a job's lifecycle (insert, claim with SKIP LOCKED, complete)
in plain SQL, no queue library in between. What PostgreSQL (or SQLite) itself
can do on this machine is the yardstick for jobkeeper's overhead.

Clients are separate processes (so Python's GIL is not what is measured),
each with one autocommit connection; they start together behind a barrier and
each records its own start and end; a rate is jobs / (last end - first start).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import psycopg

from benchmarks.harness import connect_patiently, sqlite_connect
from benchmarks.libs import time_calls

PG_SCHEMA = """
CREATE TABLE raw_jobs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL DEFAULT 'default',
    args         jsonb       NOT NULL DEFAULT '{}',
    status       text        NOT NULL DEFAULT 'available',
    priority     smallint    NOT NULL DEFAULT 0,
    attempt      integer     NOT NULL DEFAULT 0,
    worker       text,
    scheduled_at timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    attempted_at timestamptz,
    finished_at  timestamptz
);
-- The claim's order and index are jobkeeper's own (priority, due time, id):
-- ordered by id alone, the planner walks the primary key past every
-- completed row (its statistics, taken when all rows were available, say the
-- filter costs nothing), and each claim costs more than the last.
CREATE INDEX raw_jobs_claim ON raw_jobs (queue, priority, scheduled_at, id)
    WHERE status = 'available';
"""

PG_INSERT_ONE = "INSERT INTO raw_jobs (queue, args) VALUES ('default', '{}')"
PG_INSERT_MANY = (
    "INSERT INTO raw_jobs (queue, args) SELECT 'default', a FROM unnest(%s::jsonb[]) AS a"
)
PG_CLAIM = """
WITH candidates AS MATERIALIZED (
    SELECT id FROM raw_jobs
    WHERE status = 'available' AND queue = 'default'
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE raw_jobs AS job
SET status = 'running', attempt = job.attempt + 1, attempted_at = now(), worker = %(worker)s
FROM candidates
WHERE job.id = candidates.id
RETURNING job.id, job.args
"""
PG_COMPLETE = (
    "UPDATE raw_jobs SET status = 'completed', finished_at = now(), worker = NULL "
    "WHERE id = ANY(%s) AND status = 'running'"
)

SQLITE_SCHEMA = """
CREATE TABLE raw_jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL DEFAULT 'default',
    args         TEXT    NOT NULL DEFAULT '{}',
    status       TEXT    NOT NULL DEFAULT 'available',
    priority     INTEGER NOT NULL DEFAULT 0,
    attempt      INTEGER NOT NULL DEFAULT 0,
    worker       TEXT,
    scheduled_at REAL    NOT NULL DEFAULT (((julianday('now') - 2440587.5) * 86400.0)),
    created_at   REAL    NOT NULL DEFAULT (((julianday('now') - 2440587.5) * 86400.0)),
    attempted_at REAL,
    finished_at  REAL
);
-- jobkeeper's claim order and index (see PG_SCHEMA): ordered by rowid alone,
-- SQLite scans the table from its first, long-completed row on every claim.
CREATE INDEX raw_jobs_claim ON raw_jobs (queue, priority, scheduled_at, id)
    WHERE status = 'available';
"""
SQLITE_INSERT = "INSERT INTO raw_jobs (queue, args) VALUES ('default', '{}')"
SQLITE_CLAIM = """
UPDATE raw_jobs
SET status = 'running', attempt = attempt + 1, worker = ?,
    attempted_at = ((julianday('now') - 2440587.5) * 86400.0)
WHERE id IN (SELECT id FROM raw_jobs WHERE status = 'available' AND queue = 'default'
             ORDER BY priority, scheduled_at, id LIMIT ?)
RETURNING id, args
"""
SQLITE_COMPLETE = (
    "UPDATE raw_jobs SET status = 'completed', worker = NULL, "
    "finished_at = ((julianday('now') - 2440587.5) * 86400.0) "
    "WHERE id = ? AND status = 'running'"
)


# -- PostgreSQL -----------------------------------------------------------------


def pg_prepare(url: str) -> None:
    with connect_patiently(url) as conn:
        conn.execute(PG_SCHEMA)


def pg_fill(url: str, n: int) -> None:
    """Pre-fill ``n`` available jobs with COPY (not timed), then ANALYZE."""
    with connect_patiently(url) as conn:
        with (
            conn.transaction(),
            conn.cursor() as cursor,
            cursor.copy("COPY raw_jobs (queue, args) FROM STDIN") as copy,
        ):
            for _ in range(n):
                copy.write_row(("default", "{}"))
        conn.execute("ANALYZE raw_jobs")


def _timed(call: Callable[[], object]) -> Callable[[int], float]:
    """``block(k)``: the seconds ``k`` calls of ``call`` take (timed as the
    libraries' calls are, :func:`benchmarks.libs.time_calls`)."""
    return lambda k: time_calls(call, k).seconds


@contextlib.contextmanager
def pg_single_inserter(url: str) -> Iterator[Callable[[int], float]]:
    """Yields ``block(k)``: the seconds ``k`` one-row INSERTs take (each its
    own transaction), on a connection opened (and warmed up) before.
    """
    with connect_patiently(url) as conn:
        conn.execute(PG_INSERT_ONE)
        yield _timed(lambda: conn.execute(PG_INSERT_ONE))


@contextlib.contextmanager
def pg_multirow_inserter(url: str, batch: int) -> Iterator[Callable[[int], float]]:
    """:func:`pg_single_inserter`, each call one multi-row INSERT (unnest of
    an array parameter) of ``batch`` rows."""
    with connect_patiently(url) as conn:
        conn.execute(PG_INSERT_ONE)
        args = ["{}"] * batch
        yield _timed(lambda: conn.execute(PG_INSERT_MANY, (args,)))


def _copy(conn: psycopg.Connection[Any], statement: str, row: tuple[Any, ...], n: int) -> None:
    """One COPY of ``n`` times ``row``, in its own transaction."""
    with conn.transaction(), conn.cursor() as cursor, cursor.copy(statement) as copy:
        for _ in range(n):
            copy.write_row(row)


@contextlib.contextmanager
def pg_copier(url: str, batch: int) -> Iterator[Callable[[int], float]]:
    """:func:`pg_single_inserter`, each call one COPY of ``batch`` rows."""
    with connect_patiently(url) as conn:
        conn.execute(PG_INSERT_ONE)
        yield _timed(
            lambda: _copy(conn, "COPY raw_jobs (queue, args) FROM STDIN", ("default", "{}"), batch)
        )


@contextlib.contextmanager
def pg_jobkeeper_table_copier(url: str, batch: int) -> Iterator[Callable[[int], float]]:
    """:func:`pg_copier`, but into jobkeeper's own ``jobkeeper_jobs`` (migrated
    by the caller): the columns jobkeeper's COPY writes and its partial
    indexes, ids from the identity default (since schema version 12 the table
    has no trigger: jobkeeper's bulk enqueue sends its NOTIFYs from the
    statement that checks ``max_pending`` after the rows, which it runs
    anyway). The
    server's share of a bulk enqueue: what is left of jobkeeper's time is the
    client's (validation, encoding, building the returned jobs).
    """
    statement = "COPY jobkeeper_jobs (queue, task, args, priority, max_attempts) FROM STDIN"
    with connect_patiently(url) as conn:
        _copy(conn, statement, ("default", "noop", "{}", 0, 20), 1)
        yield _timed(lambda: _copy(conn, statement, ("default", "noop", "{}", 0, 20), batch))


def _pg_client(
    url: str, mode: str, batch: int, jobs: int, barrier: Any, out: Any, index: int
) -> None:
    """One client process: ``lifecycle`` inserts, claims and completes ``jobs``
    jobs ``batch`` at a time; ``drain`` claims and completes until nothing is
    left.
    """
    worker = f"raw-{index}"
    with connect_patiently(url) as conn:
        conn.execute("SELECT 1")
        barrier.wait()
        started, cpu_started = time.time(), time.process_time()
        done = 0
        if mode == "lifecycle":
            while done < jobs:
                size = min(batch, jobs - done)
                if size == 1:
                    conn.execute(PG_INSERT_ONE)
                else:
                    conn.execute(PG_INSERT_MANY, (["{}"] * size,))
                claimed = conn.execute(PG_CLAIM, {"limit": size, "worker": worker}).fetchall()
                if claimed:
                    conn.execute(PG_COMPLETE, ([row[0] for row in claimed],))
                done += size
        else:
            while True:
                claimed = conn.execute(PG_CLAIM, {"limit": batch, "worker": worker}).fetchall()
                if not claimed:
                    break
                conn.execute(PG_COMPLETE, ([row[0] for row in claimed],))
                done += len(claimed)
        out.put((index, started, time.time(), done, time.process_time() - cpu_started))


class ClientsRun(NamedTuple):
    """What :func:`pg_clients` / :func:`sqlite_clients` measured: ``seconds``
    from the first client's start (after every client connected) to the last
    one's end, the jobs ``done``, and the clients' ``cpu`` seconds in that
    loop (their start-up left out, as it is from ``seconds``).
    """

    seconds: float
    done: int
    cpu: float


def pg_clients(url: str, mode: str, batch: int, clients: int, jobs: int) -> ClientsRun:
    """Run ``clients`` processes; returns (seconds, jobs done). For ``lifecycle``,
    ``jobs`` is the total split between the clients; for ``drain`` the backlog
    must be filled first.
    """
    return _run_clients(_pg_client, url, mode, batch, clients, jobs)


def _run_clients(
    target: Any, url: str, mode: str, batch: int, clients: int, jobs: int
) -> ClientsRun:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(clients)
    out = context.Queue()
    share = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    processes = [
        context.Process(target=target, args=(url, mode, batch, share[i], barrier, out, i))
        for i in range(clients)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=3600) for _ in processes]
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"raw client exited with code {process.exitcode}")
    first = min(r[1] for r in results)
    last = max(r[2] for r in results)
    return ClientsRun(last - first, sum(r[3] for r in results), sum(r[4] for r in results))


# -- SQLite ---------------------------------------------------------------------


def _sqlite(url: str) -> sqlite3.Connection:
    conn = sqlite_connect(url)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")  # as jobkeeper's SQLite backend
    return conn


def sqlite_prepare(url: str) -> None:
    conn = _sqlite(url)
    try:
        conn.executescript(SQLITE_SCHEMA)
    finally:
        conn.close()


def sqlite_fill(url: str, n: int) -> None:
    conn = _sqlite(url)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(SQLITE_INSERT, ([] for _ in range(n)))
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


@contextlib.contextmanager
def sqlite_single_inserter(url: str) -> Iterator[Callable[[int], float]]:
    """:func:`pg_single_inserter` on SQLite (autocommit: one transaction each)."""
    conn = _sqlite(url)
    try:
        conn.execute(SQLITE_INSERT)
        yield _timed(lambda: conn.execute(SQLITE_INSERT))
    finally:
        conn.close()


@contextlib.contextmanager
def sqlite_many_inserter(url: str, batch: int) -> Iterator[Callable[[int], float]]:
    """Each call an ``executemany`` of ``batch`` rows in one transaction."""
    conn = _sqlite(url)

    def insert_many() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(SQLITE_INSERT, ([] for _ in range(batch)))
        conn.execute("COMMIT")

    try:
        conn.execute(SQLITE_INSERT)
        yield _timed(insert_many)
    finally:
        conn.close()


def _sqlite_claim(conn: sqlite3.Connection, worker: str, limit: int) -> list[int]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        rows = conn.execute(SQLITE_CLAIM, (worker, limit)).fetchall()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return [row[0] for row in rows]


def _sqlite_complete(conn: sqlite3.Connection, ids: list[int]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(SQLITE_COMPLETE, ((i,) for i in ids))
    conn.execute("COMMIT")


def _sqlite_client(
    url: str, mode: str, batch: int, jobs: int, barrier: Any, out: Any, index: int
) -> None:
    worker = f"raw-{index}"
    conn = _sqlite(url)
    try:
        barrier.wait()
        started, cpu_started = time.time(), time.process_time()
        done = 0
        if mode == "lifecycle":
            while done < jobs:
                size = min(batch, jobs - done)
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(SQLITE_INSERT, ([] for _ in range(size)))
                conn.execute("COMMIT")
                ids = _sqlite_claim(conn, worker, size)
                if ids:
                    _sqlite_complete(conn, ids)
                done += size
        else:
            while True:
                ids = _sqlite_claim(conn, worker, batch)
                if not ids:
                    break
                _sqlite_complete(conn, ids)
                done += len(ids)
        out.put((index, started, time.time(), done, time.process_time() - cpu_started))
    finally:
        conn.close()


def sqlite_clients(url: str, mode: str, batch: int, clients: int, jobs: int) -> ClientsRun:
    return _run_clients(_sqlite_client, url, mode, batch, clients, jobs)
