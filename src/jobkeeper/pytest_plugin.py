"""jobkeeper's pytest plugin (entry point ``pytest11``): the fixtures
``jobkeeper_database_url`` and ``jobkeeper_queue`` described in
:mod:`jobkeeper.testing`, whose helpers need no pytest, so that code tested
without it (Django's test runner) can import them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

from jobkeeper.api import JobQueue
from jobkeeper.api.base import QueueBase, check_database_use
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

    While it is active, any other JobQueue of the process that is not on the
    test database refuses to use its database (see :class:`_OnlyTheTestDatabase`):
    the test fails, naming the ini option and where the queue points.
    """
    spec = str(request.config.getini("jobkeeper_app") or "")
    if not spec:
        jq = JobQueue(jobkeeper_database_url)
        with _only_the_test_database(request, jq, spec):
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
        with _only_the_test_database(request, jq, spec):
            jq.migrate()
            yield jq
    finally:
        jq.use_database(previous)


class _OnlyTheTestDatabase:
    """The check :func:`jobkeeper.api.base.check_database_use` calls while a
    ``jobkeeper_queue`` fixture is active: a queue on any other database than
    the test's is refused, before it connects, with a message naming the
    ``jobkeeper_app`` ini option and the database it points at. Without it, a
    task registered on the application's own queue (``charge.enqueue(...)``)
    wrote its job into the developer's real database while the test drained
    the empty test one.
    """

    def __init__(self, jq: JobQueue, spec: str) -> None:
        self.url = jq.url.url
        self.spec = spec
        #: The first refusal, reported again at teardown: code that caught it
        #: (a task run by ``drain``, whose failure is only an attempt's) must
        #: not leave the test passing.
        self.refused: str | None = None

    def __call__(self, queue: QueueBase) -> None:
        if queue.url.url == self.url:
            return
        __tracebackhide__ = True  # the test's own line is the one to show
        tasks = ", ".join(sorted(queue.tasks)) or "none"
        where = f"{queue.url.redacted()} (tasks: {tasks})"
        if self.spec:
            fix = (
                f"Only the queue of the ini option jobkeeper_app = {self.spec} is pointed "
                "at the test database: register the tasks on it, or use jobkeeper_database_url "
                "and a queue of your own"
            )
        else:
            fix = (
                "Set the ini option jobkeeper_app (e.g. jobkeeper_app = myapp.jobs:jq, in "
                "pytest.ini) to the JobQueue your tasks are registered on: the fixture then "
                "points it at the test database for each test"
            )
        message = (
            f"jobkeeper_queue: a JobQueue on {where} was used during the test, not the "
            f"test database the fixture made; nothing was written there. {fix}"
        )
        if self.refused is None:
            self.refused = message
        raise ConfigError(message)


@contextlib.contextmanager
def _only_the_test_database(
    request: pytest.FixtureRequest, jq: JobQueue, spec: str
) -> Iterator[None]:
    """Refuse every queue not on ``jq``'s database while the block runs; then
    fail the test if one was refused and the test itself passed (the refusal
    may have been caught by the code under test).
    """
    check = _OnlyTheTestDatabase(jq, spec)
    check_database_use(check)
    try:
        yield
    finally:
        check_database_use(None)
    report = request.node.stash.get(_CALL_REPORT, None)
    if check.refused is not None and (report is None or report.passed):
        _unusable(check.refused)


#: The report of a test's call phase, kept for the fixture's teardown.
_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


# Old-style hookwrapper: the plugin loads in any project, on older pytests too.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Keep each test's call report for :func:`_only_the_test_database`."""
    outcome = yield
    if call.when == "call":
        report: pytest.TestReport = outcome.get_result()
        item.stash[_CALL_REPORT] = report


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
