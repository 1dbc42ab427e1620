"""A PostgreSQL server whose sessions turn read-only.

A demoted primary, a replica promoted elsewhere behind the same address, or
``default_transaction_read_only``: every write fails with "cannot execute
UPDATE in a read-only transaction" while a session is read-only, and a
session keeps the setting it started with. jobkeeper must treat such a
session as lost (drop it, reconnect), so work resumes once the server takes
writes again, and a stop stays prompt meanwhile.

Each test has a database of its own on the shared server, made read-only for
new sessions with ``ALTER DATABASE ... SET default_transaction_read_only``
and its open sessions ended with ``pg_terminate_backend`` (as a failover
ends them); the shared ``test`` database is never touched.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from collections.abc import Iterator

import psycopg
import pytest

from jobkeeper import JobQueue, JobStatus
from jobkeeper.errors import DatabaseUnavailable
from support.db import PG_URL, pg_database_url
from support.settings import READ_ONLY
from support.waiting import wait_for

from .helpers import processes, wait_exit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        "postgres" not in os.environ.get("JOBKEEPER_TEST_BACKENDS", "postgres"),
        reason="PostgreSQL only",
    ),
]


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(PG_URL, autocommit=True)


@pytest.fixture
def ro_db() -> Iterator[str]:
    """The name of a fresh database of this test's own (dropped after)."""
    name = f"jk_ro_{secrets.token_hex(5)}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def read_only(database: str, *, terminate: bool) -> None:
    """New sessions of ``database`` are read-only; with ``terminate``, its
    open sessions end too (their clients reconnect, read-only)."""
    with _admin() as conn:
        conn.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        if terminate:
            terminate_sessions(conn, database)


def terminate_sessions(conn: psycopg.Connection[tuple[object, ...]], database: str) -> None:
    # Waiting (up to 5 s) for each session to end: its client then finds it
    # ended, and the first call after this is not a race with the kill.
    conn.execute(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()",
        (database,),
    )


def writable(database: str) -> None:
    """New sessions take writes again. Open ones keep read-only (PostgreSQL
    applies the setting at session start): nothing ends them here."""
    with _admin() as conn:
        conn.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')


def superuser_sql(
    url: str, query: str, params: tuple[object, ...] = ()
) -> list[tuple[object, ...]]:
    """A statement on a session of its own that overrides the read-only default."""
    with psycopg.connect(url, autocommit=True, options="-c default_transaction_read_only=off") as c:
        cursor = c.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def statuses(url: str) -> dict[str, int]:
    rows = superuser_sql(url, "SELECT status, count(*) FROM jobkeeper_jobs GROUP BY status")
    return {str(status): int(str(n)) for status, n in rows}


def test_worker_resumes_once_the_server_is_writable_again(ro_db, tmp_path):
    url = pg_database_url(ro_db)
    jq = JobQueue(url, **READ_ONLY)
    jq.migrate()
    try:
        # One job in flight when the sessions turn read-only: its outcome
        # cannot be written until the server takes writes again.
        first = jq.enqueue("sleep", {"seconds": 1.5})
        with processes(tmp_path) as procs:
            worker = procs.worker(url, READ_ONLY, concurrency=2)
            wait_for(lambda: statuses(url).get("running") == 1, what="the first job running")
            read_only(ro_db, terminate=True)
            # Enqueued while the server is read-only (by someone who can write).
            for _ in range(4):
                superuser_sql(
                    url,
                    "INSERT INTO jobkeeper_jobs (queue, task, args) "
                    "VALUES ('default', 'sleep', '{\"seconds\": 0.1}')",
                )
            time.sleep(3)  # the in-flight job ends and its ack fails meanwhile
            assert worker.poll() is None, procs.log(worker)
            writable(ro_db)
            wait_for(
                lambda: statuses(url) == {"completed": 5},
                timeout=30,
                what="every job completed once the server is writable (none left running)",
            )
            assert "read-only" in procs.log(worker)
            worker.send_signal(signal.SIGTERM)
            assert wait_exit(worker, timeout=30) == 0, procs.log(worker)
        assert jq.get_job(first.id).attempt == 1  # ran once: its ack waited, was not lost
    finally:
        jq.close()


def test_sigterm_while_read_only_stops_the_worker_promptly(ro_db, tmp_path):
    url = pg_database_url(ro_db)
    jq = JobQueue(url, **READ_ONLY)
    jq.migrate()
    try:
        jq.enqueue("sleep", {"seconds": 0.5})
        jq.enqueue("sleep", {"seconds": 60})
        with processes(tmp_path) as procs:
            worker = procs.worker(url, READ_ONLY, concurrency=2)
            wait_for(lambda: statuses(url).get("running") == 2, what="both jobs running")
            read_only(ro_db, terminate=True)
            jq.close()
            time.sleep(2)  # the short job ends; its ack fails
            started = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            # shutdown_grace is 2 s: the long job is handed back (in memory)
            # then; outcomes the read-only server refuses are left to the
            # rescuer (at-least-once), not retried without end.
            code = wait_exit(worker, timeout=60)
            took = time.monotonic() - started
            assert took < 2.0 + 6.0, f"stop took {took:.1f}s\n{procs.log(worker)}"
            assert code == 1, procs.log(worker)  # outcomes left unwritten
        writable(ro_db)
        # Nothing is lost: both jobs are still held by the stopped worker
        # (rescued after rescue_after) or already finished.
        assert sum(statuses(url).values()) == 2
    finally:
        jq.close()


def test_enqueue_while_read_only_says_so_and_works_once_writable(ro_db):
    url = pg_database_url(ro_db)
    jq = JobQueue(url, **READ_ONLY)
    jq.migrate()
    try:
        jq.enqueue("t", {})  # the pool holds a session opened while writable
        read_only(ro_db, terminate=True)
        for _ in range(3):  # not only the first call: the pool must not keep such sessions
            with pytest.raises(DatabaseUnavailable, match="read-only"):
                jq.enqueue("t", {})
        writable(ro_db)
        job = jq.enqueue("t", {})
        assert jq.get_job(job.id).status == JobStatus.AVAILABLE
        assert len(jq.enqueue_many([("t", {"n": n}) for n in range(3)])) == 3
    finally:
        jq.close()


def test_async_enqueue_while_read_only_says_so_and_works_once_writable(ro_db):
    # The async pool kept a session that had turned read-only and handed it
    # to every later call: with a URL that lets read-only sessions connect,
    # enqueue_async failed 30 times in 15 s after the server took writes
    # again, while the sync API recovered at once.
    url = f"{pg_database_url(ro_db)}?target_session_attrs=any"
    jq = JobQueue(url, **{**READ_ONLY, "pool_size": 2})
    jq.migrate()

    async def scenario() -> list[str]:
        outcomes = []
        await jq.enqueue_async("t", {})  # the loop's pool holds a writable session
        read_only(ro_db, terminate=True)
        for _ in range(3):
            with pytest.raises(DatabaseUnavailable, match="read-only"):
                await jq.enqueue_async("t", {})
        writable(ro_db)
        # A session the pool reopened while the server was still read-only
        # may fail one more call; it is then dropped with the others.
        for _ in range(4):
            try:
                await jq.enqueue_async("t", {"after": True})
                outcomes.append("ok")
            except DatabaseUnavailable as exc:
                assert "read-only" in str(exc)
                outcomes.append("read-only")
        await jq.aclose()
        return outcomes

    try:
        outcomes = asyncio.run(scenario())
        assert outcomes.count("read-only") <= 1 and outcomes[-3:] == ["ok"] * 3, outcomes
        assert statuses(url)["available"] == 1 + outcomes.count("ok")
    finally:
        jq.close()


def test_enqueue_works_once_a_reloaded_setting_is_lifted(ro_db):
    """Sessions that were read-only from their start (none terminated when
    the server became writable again) are replaced, not kept by the pool."""
    url = pg_database_url(ro_db)
    read_only(ro_db, terminate=False)
    jq = JobQueue(url, **{**READ_ONLY, "pool_size": 3})
    try:
        superuser_sql(url, "SELECT 1")
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            jq.migrate()
        writable(ro_db)
        jq.migrate()
        for n in range(5):
            jq.enqueue("t", {"n": n})
        assert statuses(url) == {"available": 5}
    finally:
        jq.close()


def test_connections_ask_for_a_writable_session_unless_the_url_chooses(ro_db, monkeypatch):
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    read_only(ro_db, terminate=False)
    chosen = JobQueue(f"{pg_database_url(ro_db)}?target_session_attrs=any", **READ_ONLY)
    default = JobQueue(pg_database_url(ro_db), **READ_ONLY)
    try:
        # The default refuses the read-only server at connect...
        with pytest.raises(DatabaseUnavailable, match="session is read-only"):
            default.stats()
        # ...the user's own choice is kept: it connects, and reads work.
        assert chosen.backend.schema_version() == 0  # type: ignore[attr-defined]
    finally:
        chosen.close()
        default.close()
