"""The test database server and raw SQL on either backend.

A *target* is a :class:`~jobkeeper.JobQueue` or a database URL string, so the
in-process tests (which hold a queue) and the process tests (which hold a URL
they hand to workers) share one set of helpers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest

from jobkeeper import Job, JobQueue

#: The PostgreSQL server every PostgreSQL test uses (a fresh schema or
#: database of its own on it); tests/conftest.py stops the run if it is down.
PG_URL = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")

Target = JobQueue | str


def url_of(target: Target) -> str:
    return target.url.url if isinstance(target, JobQueue) else target


def is_pg(target: Target) -> bool:
    if isinstance(target, JobQueue):
        return target.url.scheme == "postgresql"
    return target.startswith("postgres")


def now_sql(target: Target) -> str:
    """The backend's "now" in its stored timestamp type."""
    return "now()" if is_pg(target) else "((julianday('now') - 2440587.5) * 86400.0)"


def _sqlite_path(target: Target) -> str:
    if isinstance(target, JobQueue):
        return target.url.path
    return target.removeprefix("sqlite:///")


def sql(target: Target, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh autocommit connection, with ``?``
    placeholders on both backends; returns the rows, if any.
    """
    if is_pg(target):
        with psycopg.connect(url_of(target), autocommit=True) as conn:
            cursor = conn.execute(query.replace("?", "%s"), tuple(params))
            return cursor.fetchall() if cursor.description else []
    conn = sqlite3.connect(_sqlite_path(target), timeout=30, isolation_level=None)
    try:
        return conn.execute(query, tuple(params)).fetchall()
    finally:
        conn.close()


def count(target: Target, table: str = "jobkeeper_jobs", where: str = "TRUE") -> int:
    """Rows of ``table`` matching ``where`` (SQL; ``TRUE`` works on SQLite too)."""
    where = where if is_pg(target) else where.replace("TRUE", "1")
    return int(sql(target, f"SELECT count(*) FROM {table} WHERE {where}")[0][0])


def job(jq: JobQueue, job_id: int) -> Job:
    """The job ``job_id``, which must exist."""
    found = jq.get_job(job_id)
    assert found is not None, f"job {job_id} vanished"
    return found


def pg_schema_url(schema: str, server: str = PG_URL) -> str:
    """``server`` with ``search_path`` set to ``schema``."""
    separator = "&" if "?" in server else "?"
    return f"{server}{separator}options={quote(f'-csearch_path={schema}')}"


@contextlib.contextmanager
def fresh_pg_schema() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh, empty schema of the
    test database, dropped after the block.
    """
    schema = f"jk_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield pg_schema_url(schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def pg_database_url(database: str) -> str:
    """``PG_URL`` naming another database on the same server."""
    return urlunsplit(urlsplit(PG_URL)._replace(path=f"/{database}"))


def end_sessions(application_name: str) -> None:
    """Terminate every session of ``application_name`` (what a server restart
    does to a client's connections) and wait until they are gone.
    """
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        pids = [
            row[0]
            for row in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                (application_name,),
            ).fetchall()
        ]
        assert pids, f"no session of {application_name} to end"
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if left is not None and left[0] == 0:
                return
            time.sleep(0.01)
    raise AssertionError(f"sessions {pids} still there after 10 s")


def migrate_to(jq: JobQueue, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Apply ``jq``'s backend's migrations up to ``version`` only (an older database)."""
    # The module whose MIGRATIONS its migrate() reads.
    module = sys.modules[type(jq.backend).migrate.__module__]
    with monkeypatch.context() as patch:
        patch.setattr(module, "MIGRATIONS", [m for m in module.MIGRATIONS if m[0] <= version])
        assert jq.migrate() == version
