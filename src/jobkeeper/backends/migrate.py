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

#: Runs one statement with positional parameters and returns its rows.
Execute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def apply_migrations(
    execute: Execute,
    migrations: Sequence[tuple[int, Sequence[str]]],
    queries: dict[str, str],
) -> int:
    """Apply every migration newer than the recorded version, in order.

    Args:
        execute: runs a statement in the caller's locked transaction.
        migrations: ``(version, statements)`` in ascending order.
        queries: the backend's named queries; uses ``schema_create``,
            ``schema_version`` and ``schema_record`` (one positional
            parameter: the version).

    Returns:
        The schema version now applied.
    """
    execute(queries["schema_create"], ())
    current = int(execute(queries["schema_version"], ())[0][0])
    for version, statements in migrations:
        if version <= current:
            continue
        for statement in statements:
            execute(statement, ())
        execute(queries["schema_record"], (version,))
        current = version
    return current
