"""The one migration runner every backend uses (internal).

Migrations are numbered files, ``NNNN_name.sql``, in each backend's
``migrations/`` package; ``jobkeeper_schema`` records the versions applied.
A backend runs :func:`apply_migrations` inside one transaction that holds
its migration lock (PostgreSQL: an advisory transaction lock; SQLite: the
write lock of ``BEGIN IMMEDIATE``), so concurrent ``migrate()`` calls apply
each migration exactly once and a failed one leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jobkeeper.errors import DatabaseError, DatabaseUnavailable

#: Runs one statement with positional parameters and returns its rows.
Execute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def apply_migrations(
    execute: Execute,
    migrations: Sequence[tuple[int, Sequence[str]]],
    queries: dict[str, str],
    before_applying: Callable[[int], None] | None = None,
    *,
    migrate_hint: str,
) -> int:
    """Apply every migration newer than the recorded version, in order.

    Args:
        execute: runs a statement in the caller's locked transaction.
        migrations: ``(version, statements)`` in ascending order.
        queries: the backend's named queries; uses ``schema_create``,
            ``schema_version``, ``schema_tables_exist`` and
            ``schema_record`` (one positional parameter: the version).
        before_applying: called with the recorded version (0: none),
            read under the caller's lock, when a migration is to be
            applied, before the first one is.
        migrate_hint: the database's ``DatabaseURL.migrate_hint()``, for
            the error below.

    Returns:
        The schema version now applied.

    Raises:
        DatabaseError: jobkeeper's tables exist with no version recorded
            (see :func:`unrecorded_schema`); nothing is applied.
    """
    execute(queries["schema_create"], ())
    current = int(execute(queries["schema_version"], ())[0][0])
    if current == 0 and execute(queries["schema_tables_exist"], ())[0][1]:
        raise unrecorded_schema(migrations[-1][0], migrate_hint)
    if before_applying is not None and current < migrations[-1][0]:
        before_applying(current)
    for version, statements in migrations:
        if version <= current:
            continue
        for statement in statements:
            execute(statement, ())
        execute(queries["schema_record"], (version,))
        current = version
    return current


class SchemaLockTimeoutError(DatabaseUnavailable):
    """``migrate`` waited its ``lock_wait`` for its locks in vain; nothing of
    it was written. Unavailable, like any lock timeout: it passes once the
    session holding the lock ends its transaction.
    """


class UnrecordedSchemaError(DatabaseError):
    """jobkeeper's jobs table found without a schema version recorded
    (see :func:`unrecorded_schema`).
    """


def unrecorded_schema(expected: int, migrate_hint: str) -> UnrecordedSchemaError:
    """The error for jobkeeper's tables found without a schema version
    recorded: ``jobkeeper_schema`` emptied or dropped (by hand, or by a
    restore that left it out). Read as "not migrated", such a database had
    ``migrate`` fail with "table jobkeeper_jobs already exists" while
    ``doctor`` kept advising ``migrate``.

    Args:
        expected: the schema version of this code, named in the message
            (the version of tables this code made or last migrated).
        migrate_hint: the database's ``DatabaseURL.migrate_hint()``: a bare
            ``jobkeeper migrate`` migrates the default database.
    """
    return UnrecordedSchemaError(
        "jobkeeper_schema records no schema version, yet a jobkeeper_jobs table exists: "
        "jobkeeper_schema's rows were deleted or the table dropped (or that table is not "
        "jobkeeper's), so which migrations to run is unknown; nothing was changed. Record the "
        f"version the tables are at (this jobkeeper's is {expected}; docs/deploying.md, "
        f'"A lost schema record", has the SQL), then {migrate_hint}'
    )


class MissingSchemaError(DatabaseError):
    """PostgreSQL: no schema of the search path exists, so there is no
    current schema to keep jobkeeper's tables in (a misspelt or unquoted
    name in the URL).
    """


class MisplacedSchemaError(DatabaseError):
    """PostgreSQL: the current schema (the first of the search path, where
    jobkeeper keeps its tables) has none of them, while the search path
    finds a jobkeeper_jobs table in another schema further down (see
    :func:`misplaced_schema`).
    """


def misplaced_schema(current: str, found: str, migrate_hint: str) -> MisplacedSchemaError:
    """The error for a search path such as ``tenant,public`` whose first
    schema, ``current``, is not migrated while ``found`` has jobkeeper's
    tables: jobkeeper's statements found and wrote ``found``'s jobs, one
    tenant's worker running another's.

    Args:
        current: the current schema's name.
        found: the schema whose jobkeeper_jobs the search path finds.
        migrate_hint: the database's ``DatabaseURL.migrate_hint()``.
    """
    return MisplacedSchemaError(
        f"jobkeeper's tables are not in schema {current!r}, the first of the search path, "
        f"where jobkeeper keeps them and migrate creates them; the jobkeeper_jobs that the "
        f"search path finds is in schema {found!r}, and jobkeeper neither reads nor writes "
        f"it from here. To use the tables of {found!r}, put {found!r} first in the URL's "
        f"search_path; to give {current!r} tables of its own, {migrate_hint}"
    )
