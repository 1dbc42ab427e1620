"""Shared fixtures: every backend test runs on SQLite (a temp file) and on the
real PostgreSQL server (a fresh schema per test).

PostgreSQL comes from ``JOBKEEPER_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``). If it cannot be reached the
whole run stops with an error: PostgreSQL tests never skip. Only an explicit
``JOBKEEPER_TEST_BACKENDS=sqlite`` (for local work without a server) leaves
them out, and the run says so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

# The CLI's tables are as wide as COLUMNS says (200 columns when unset and
# piped): pytest-xdist's workers set it to 80, and a developer's terminal to
# anything. The CLI tests read whole cells, so they run as CI does, unset.
os.environ.pop("COLUMNS", None)

from jobkeeper import JobQueue
from jobkeeper.database_url import DATABASE_URL_ENV
from support.db import PG_URL, fresh_pg_schema
from support.notify import listener, pg_jq  # noqa: F401 - fixtures: a queue and its LISTEN
from support.settings import FAST

BACKENDS = [
    name.strip()
    for name in os.environ.get("JOBKEEPER_TEST_BACKENDS", "sqlite,postgres").split(",")
    if name.strip()
]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"jobkeeper backends: {', '.join(BACKENDS)} (PostgreSQL: {PG_URL})"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if "postgres" not in BACKENDS:
        print("\nWARNING: PostgreSQL tests deselected by JOBKEEPER_TEST_BACKENDS", file=sys.stderr)
        return
    try:
        with psycopg.connect(PG_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.exit(
            f"PostgreSQL is unreachable at {PG_URL}: {exc}\n"
            "Start it (pg_ctlcluster ... main start) or set JOBKEEPER_TEST_PG_URL. "
            "PostgreSQL tests never skip.",
            returncode=3,
        )


@pytest.fixture(autouse=True)
def _database_url_variable_restored() -> Iterator[None]:
    """``jobkeeper --database URL ... --app ...`` run in-process sets
    ``$JOBKEEPER_DATABASE_URL`` for the process (so that a worker's
    follow-up jobs use that database): put it back after each test, or a
    later test's command would find it set (and say it leaves it unused).
    """
    saved = os.environ.get(DATABASE_URL_ENV)
    yield
    if saved is None:
        os.environ.pop(DATABASE_URL_ENV, None)
    else:
        os.environ[DATABASE_URL_ENV] = saved


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh, empty schema (dropped after)."""
    with fresh_pg_schema() as url:
        yield url


@pytest.fixture
def other_pg_url() -> Iterator[str]:
    """A second fresh schema of the same database, beside :func:`pg_url`'s."""
    with fresh_pg_schema() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    """An empty, unmigrated database of each backend."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(request.getfixturevalue("sqlite_url"))


@pytest.fixture
def make_queue(db_url: str) -> Iterator[Callable[..., JobQueue]]:
    """Factory: ``make_queue(**settings)`` -> a migrated JobQueue on ``db_url``
    (FAST settings unless overridden). Queues are closed after the test."""
    made: list[JobQueue] = []

    def make(**settings: Any) -> JobQueue:
        jq = JobQueue(db_url, **{**FAST, **settings})
        jq.migrate()
        made.append(jq)
        return jq

    yield make
    for jq in made:
        jq.close()


@pytest.fixture
def jq(make_queue: Callable[..., JobQueue]) -> JobQueue:
    """A migrated JobQueue with FAST settings on each backend."""
    return make_queue()
