"""The backend seam itself: every backend implements every operation of the
Protocol with the same signature, and the SQL behind the operations is
named alike in every backend's ``queries.sql`` (the River driver test idea:
a third backend is one more entry in ``BACKENDS``).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest

import jobkeeper.backends.postgres.backend as postgres_module
import jobkeeper.backends.sqlite.backend as sqlite_module
from jobkeeper.backends.base import Backend
from jobkeeper.backends.postgres.backend import PostgresBackend
from jobkeeper.backends.sqlite.backend import SqliteBackend

BACKENDS: dict[str, tuple[type, ModuleType]] = {
    "postgresql": (PostgresBackend, postgres_module),
    "sqlite": (SqliteBackend, sqlite_module),
}

#: Queries only one backend needs, each with the reason. Any other query a
#: backend has alone must be a step of a query both have, named after it
#: (``job_claim_probe``, ``job_fail_dead_many_delete``).
ONLY_IN = {
    "postgresql": {
        # The planner's statistics and VACUUM (SQLite's planner needs none,
        # and it rewrites rows in place).
        "job_table_maintain_analyze",
        "job_table_maintain_stats",
        "job_table_maintain_vacuum",
        # NOTIFY and its channel; SQLite wakes in-process and through data_version
        # (notify_done: the end of awaited jobs, for wait's listener).
        "notify_done",
        "notify_channel",
        "notify_due",
        "notify_queues",
        # migrate()'s advisory lock (one per schema, named by schema_current);
        # SQLite's BEGIN IMMEDIATE serialises it. Its try first, and who holds
        # it (or a table's lock) when a try waited in vain: SQLite cannot say
        # who holds its write lock.
        "schema_current",
        "schema_lock",
        "schema_lock_try",
        "schema_lock_holders",
        # migrate()'s lock of the jobs table before it migrates a schema in
        # use (a deadlock with a claim in flight); SQLite has one writer.
        "schema_lock_jobs",
        # The schema watch's bound on waiting for a lock on jobkeeper_schema;
        # SQLite's reads (WAL) never wait on a writer.
        "schema_lock_wait",
        # A retired index dropped CONCURRENTLY after migrate commits; SQLite's
        # migration drops it inside (one writer: no deadlock to avoid).
        "schema_drop_serial_first_index",
        "schema_index_exists",
        # Flags a job so that its end NOTIFYs its waiters (a trigger); SQLite's
        # waiters watch data_version instead and need no flag.
        "job_mark_awaited",
        # Facts doctor judges only on a server: table bloat, old snapshots,
        # the NOTIFY queue, the database's encoding (SQLite's text is UTF-8).
        "database_health_encoding",
        "database_health_indexes",
        "database_health_notify",
        "database_health_table",
        "database_health_xmin",
        # Whether a new connection reaches the server itself or a pooler
        # (prepared statements only on the former); SQLite has no pooler.
        # And where its search path finds the jobs table, pinned to the
        # current schema when that is further down: SQLite has no schemas.
        # A session's DateStyle set to ISO (psycopg parses only that):
        # SQLite's timestamps are numbers.
        "connection_backend_pid",
        "connection_setup",
        # The stuck-call watchdog's look at a session without an answer:
        # SQLite has no network for a call to be stuck on.
        "connection_activity",
        "connection_pin_schema",
        "connection_iso_datestyle",
    },
    "sqlite": {
        # Settings of each new connection; PostgreSQL's are the server's.
        "connection_journal_wal",
        "connection_synchronous_full",
        "connection_synchronous_normal",
        "connection_journal_size_limit",
        "connection_busy_timeout",
        # The wake-up listener's cue that another connection committed;
        # PostgreSQL's listener is told by NOTIFY.
        "listen_data_version",
        # What the completion watch reads after a commit; PostgreSQL's waiters
        # are woken by a NOTIFY that names the job.
        "completion_watch_pending",
        # Facts doctor judges only on SQLite.
        "database_health_busy_timeout",
        "database_health_journal_mode",
    },
}

#: Queries that belong to no single operation (schema_* run by migrate.py
#: for every backend, the clock, NOTIFY and connection plumbing).
NOT_OPERATIONS = {
    "db_now",
    "notify_channel",
    "notify_due",
    "notify_queues",
    "notify_done",
    "connection_journal_wal",
    "connection_synchronous_full",
    "connection_synchronous_normal",
    "connection_journal_size_limit",
    "connection_busy_timeout",
    "connection_backend_pid",
    "connection_activity",
    "connection_setup",
    "connection_pin_schema",
    "connection_iso_datestyle",
}


def operations() -> dict[str, inspect.Signature]:
    # Backend is the core's Protocol over the surfaces' ones: every class of
    # its MRO that is a Protocol of ours contributes operations.
    seams = [cls for cls in Backend.__mro__ if cls.__module__.startswith("jobkeeper.backends.")]
    return {
        name: inspect.signature(member)
        for seam in seams
        for name, member in vars(seam).items()
        if callable(member) and not name.startswith("_")
    }


def query_names(module: ModuleType) -> set[str]:
    return set(module.QUERIES)


def test_the_protocol_has_operations():
    # A guard for the tests below: they would pass on an empty Protocol.
    assert {
        "job_claim",
        "job_fail_many",
        "job_stage_due",
        "queue_counts",
        "periodic_upsert",
    } <= set(operations())


@pytest.mark.parametrize("scheme", sorted(BACKENDS))
def test_every_operation_is_implemented_with_the_protocols_signature(scheme):
    cls, _ = BACKENDS[scheme]
    for name, expected in operations().items():
        implemented = getattr(cls, name, None)
        assert implemented is not None, f"{cls.__name__} lacks {name}"
        actual = inspect.signature(implemented)
        assert [(p.name, p.kind) for p in actual.parameters.values()] == [
            (p.name, p.kind) for p in expected.parameters.values()
        ], f"{cls.__name__}.{name}{actual} differs from the Protocol's {name}{expected}"


def test_both_backends_name_their_queries_alike():
    names = {scheme: query_names(module) for scheme, (_, module) in BACKENDS.items()}
    common = set.intersection(*names.values())
    for scheme, own in names.items():
        extra = own - common - ONLY_IN.get(scheme, set())
        extra = {n for n in extra if not any(n.startswith(f"{c}_") for c in common)}
        assert not extra, f"{scheme} has queries the other backends lack: {sorted(extra)}"
        listed = ONLY_IN.get(scheme, set())
        assert listed <= own, f"{scheme}: ONLY_IN names queries it lacks: {listed - own}"
        assert not listed & common, f"{scheme}: ONLY_IN names shared queries: {listed & common}"


@pytest.mark.parametrize("scheme", sorted(BACKENDS))
def test_every_query_is_named_after_its_operation(scheme):
    _, module = BACKENDS[scheme]
    ops = set(operations())
    for name in query_names(module):
        named = (
            name in ops
            or any(name.startswith(f"{op}_") for op in ops)
            or name.startswith("schema_")
            or name in NOT_OPERATIONS
        )
        assert named, f"{scheme}: query {name!r} is named after no operation"


def backend_sources(module: ModuleType) -> str:
    """The Python of a backend's package and of the shared backend modules."""
    package = Path(module.__file__).parent
    shared = package.parent
    files = [*package.glob("*.py"), *(shared / n for n in ("shared.py", "cockpit.py", "flow.py"))]
    return "\n".join(f.read_text() for f in files)


@pytest.mark.parametrize("scheme", sorted(BACKENDS))
def test_every_query_is_run_by_its_backend(scheme):
    _, module = BACKENDS[scheme]
    source = backend_sources(module)
    for name in query_names(module):
        used = (
            f'"{name}"' in source
            # migrate.py runs the schema_* queries for every backend.
            or name.startswith("schema_")
        )
        assert used, f"{scheme}: query {name!r} is never run"


@pytest.mark.parametrize("scheme", sorted(BACKENDS))
def test_no_sql_outside_queries_sql(scheme):
    """Statements live in queries.sql; transaction control (BEGIN, COMMIT,
    ROLLBACK, SAVEPOINT) may stay in code, and so may the wake-ups' own
    statements (LISTEN, PRAGMA data_version).
    """
    _, module = BACKENDS[scheme]
    package = Path(module.__file__).parent
    allowed = (
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "SAVEPOINT",
        "RELEASE",
        "LISTEN",
        "PRAGMA data_version",
    )
    for path in package.glob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for quote in ('"', "'"):
                for keyword in ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "PRAGMA ", "ANALYZE"):
                    start = f"{quote}{keyword}"
                    if start in line and not any(f"{quote}{a}" in line for a in allowed):
                        pytest.fail(
                            f"{path.name}:{number}: SQL outside queries.sql: {line.strip()}"
                        )
