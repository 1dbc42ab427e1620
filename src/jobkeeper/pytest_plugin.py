"""jobkeeper's pytest plugin (entry point ``pytest11``): the fixtures
``jobkeeper_database_url`` and ``jobkeeper_queue`` described in
:mod:`jobkeeper.testing`, whose helpers need no pytest, so that code tested
without it (Django's test runner) can import them.
"""

from __future__ import annotations

import importlib
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

from jobkeeper.api import JobQueue
from jobkeeper.testing import DATABASE_ENV


def schema_url(server: str, schema: str) -> str:
    """``server`` (a ``postgresql://`` URL) with ``schema`` first on its
    search path: added to the ``options`` it may already have
    (``-c statement_timeout=...``), which a second ``options`` would replace.
    """
    parts = urlsplit(server)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for key, value in query if key == "options"]
    rest = [(key, value) for key, value in query if key != "options"]
    options = " ".join([*given, f"-csearch_path={schema}"])
    return urlunsplit(
        parts._replace(query=urlencode([*rest, ("options", options)], quote_via=quote))
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jobkeeper")
    group.addoption(
        "--jobkeeper-database",
        default=None,
        help="PostgreSQL URL for the jobkeeper_queue fixture (a fresh schema per test); "
        f"default ${DATABASE_ENV}, else a SQLite file per test.",
    )
    parser.addini(
        "jobkeeper_app",
        "package.module:attribute of the application's JobQueue: the jobkeeper_queue "
        "fixture points it at each test's database.",
        default="",
    )


@pytest.fixture
def jobkeeper_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL for one test: a SQLite file in ``tmp_path``,
    or a new schema on the PostgreSQL server given by ``--jobkeeper-database``
    or ``$JOBKEEPER_TEST_DATABASE_URL`` (dropped after the test).
    """
    server = request.config.getoption("--jobkeeper-database") or os.environ.get(DATABASE_ENV)
    if not server:
        yield f"sqlite:///{tmp_path / 'jobkeeper-test.db'}"
        return
    if not server.startswith(("postgresql://", "postgres://")):
        raise pytest.UsageError(f"--jobkeeper-database must be a postgresql:// URL, got {server!r}")
    import psycopg

    schema = f"jobkeeper_test_{secrets.token_hex(6)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema_url(server, schema)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def jobkeeper_queue(
    request: pytest.FixtureRequest, jobkeeper_database_url: str
) -> Iterator[JobQueue]:
    """A migrated JobQueue on ``jobkeeper_database_url``: the application's
    own (ini option ``jobkeeper_app``), pointed at the test database and back
    after the test, else a new one, closed after the test.
    """
    spec = str(request.config.getini("jobkeeper_app") or "")
    if not spec:
        jq = JobQueue(jobkeeper_database_url)
        jq.migrate()
        try:
            yield jq
        finally:
            jq.close()
        return
    jq = _import_app(spec, request.config.rootpath)
    previous = jq.url.url
    jq.use_database(jobkeeper_database_url)
    try:
        jq.migrate()
        yield jq
    finally:
        jq.use_database(previous)


def _import_app(spec: str, rootpath: Path) -> JobQueue:
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        raise pytest.UsageError(f"jobkeeper_app = {spec!r}: expected package.module:attribute")
    if str(rootpath) not in sys.path:
        sys.path.insert(0, str(rootpath))
    jq = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(jq, JobQueue):
        raise pytest.UsageError(f"jobkeeper_app = {spec!r} is not a JobQueue")
    return jq
