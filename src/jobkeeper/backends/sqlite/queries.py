"""The SQLite backend's SQL, loaded once at import (internal).

Every statement the backend runs is a named block of ``queries.sql``; the
migrations are the ``migrations/NNNN_*.sql`` files, split into statements.
"""

from __future__ import annotations

from jobkeeper.backends.sqlfile import load_migrations, load_queries

#: The database clock as Unix seconds, UTC.
NOW_SQL = "((julianday('now') - 2440587.5) * 86400.0)"
ERRORS_PLUS_NEW_SQL = (
    "json_insert(CASE WHEN json_valid(errors) AND json_type(errors) = 'array' "
    "THEN errors ELSE '[]' END, '$[#]', "
    "json_set(json(:error), '$.at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"
)


#: The clock of a time-dependent operation: the database's (guarantee 7),
#: unless the caller pinned ``:now`` (Unix seconds; tests do).
CLOCK_SQL = f"coalesce(:now, {NOW_SQL})"


def _expand(sql: str) -> str:
    return (
        sql.replace("{now}", NOW_SQL)
        .replace("{clock}", CLOCK_SQL)
        .replace("{errors_plus_new}", ERRORS_PLUS_NEW_SQL)
    )


QUERIES = {name: _expand(sql) for name, sql in load_queries("jobkeeper.backends.sqlite").items()}


def _statements(script: str) -> list[str]:
    """Split a migration on lines ending in ';' (our migrations keep to that)."""
    statements, current = [], []
    for line in script.splitlines():
        if line.lstrip().startswith("--"):
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            statements.append("\n".join(current).strip().rstrip(";"))
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return [s for s in statements if s]


#: sqlite3 runs one statement at a time: each migration is split into its statements.
MIGRATIONS = [
    (version, _statements(_expand(script)))
    for version, script in load_migrations("jobkeeper.backends.sqlite.migrations")
]
