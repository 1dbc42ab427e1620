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
from typing import NoReturn
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

from jobkeeper.api import JobQueue
from jobkeeper.backends import resolve_database_url
from jobkeeper.errors import ConfigError
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
    option = request.config.getoption("--jobkeeper-database")
    server = option or os.environ.get(DATABASE_ENV)
    if not server:
        yield f"sqlite:///{tmp_path / 'jobkeeper-test.db'}"
        return
    source = "--jobkeeper-database" if option else f"${DATABASE_ENV}"
    if not server.startswith(("postgresql://", "postgres://")):
        _unusable(f"{source} must be a postgresql:// URL, got {server!r}")
    schema = f"jobkeeper_test_{secrets.token_hex(6)}"
    _on_server(server, source, f'CREATE SCHEMA "{schema}"')
    try:
        yield schema_url(server, schema)
    finally:
        _on_server(server, source, f'DROP SCHEMA "{schema}" CASCADE')


def _on_server(server: str, source: str, statement: str) -> None:
    """Run ``statement`` on ``server`` (given by ``source``, an option or a
    variable). A missing driver, a URL libpq refuses or a server that cannot
    be used fails the test with jobkeeper's one-line message, as ``JobQueue``
    words it, where psycopg's ``ModuleNotFoundError`` or ``OperationalError``
    came out of every test with its traceback.
    """
    # Failed after the except blocks, not in them: pytest would print the
    # chain of exceptions ("During handling of the above exception...").
    failed: BaseException | None = None
    try:
        url = resolve_database_url(server)  # names the extra when psycopg is missing
        import psycopg

        from jobkeeper.backends.postgres.connections import translated
    except (ConfigError, ImportError) as exc:
        failed = exc
    else:
        try:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(statement)
        except psycopg.Error as exc:
            failed = translated(exc, url) or exc
    if failed is not None:
        _unusable(f"{source}: {failed}")


def _unusable(message: str) -> NoReturn:
    """Fail the test using the fixture with ``message`` alone, no traceback
    (a UsageError raised by a fixture is reported with one).
    """
    pytest.fail(message, pytrace=False)


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
