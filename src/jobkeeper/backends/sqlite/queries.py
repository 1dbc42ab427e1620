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


#: Whether the serial claim may take its row ``job`` (in ``:queue``): unkeyed,
#: or its key's first available job there, the key neither left out (in the
#: JSON array ``:held``) nor held in any queue. One fragment for the three
#: claim-order ranges of ``job_claim_serial_head``.
SERIAL_TAKEABLE_SQL = """(job.serial_key IS NULL OR (
    job.serial_key NOT IN (SELECT value FROM json_each(:held))
    -- The key's first: one probe of jobkeeper_jobs_serial_queue_idx.
    AND job.id = (
        SELECT first.id FROM jobkeeper_jobs AS first
        WHERE first.queue = :queue AND first.serial_key = job.serial_key
          AND first.serial_key IS NOT NULL AND first.status = 'available'
        ORDER BY first.priority, first.scheduled_at, first.id
        LIMIT 1)
    AND NOT EXISTS (
        SELECT 1 FROM jobkeeper_jobs AS holder
        WHERE holder.serial_key = job.serial_key
          AND holder.status IN ('claimed', 'running'))))"""


#: The serial_unkeyed flag of a new job without a serial key in ``:queue``
#: (see migration 0017): 1 in a serial queue, else NULL.
SERIAL_UNKEYED_SQL = (
    "(SELECT 1 FROM jobkeeper_queues AS settings WHERE settings.name = :queue AND settings.serial)"
)


#: The clock of a time-dependent operation: the database's (guarantee 7),
#: unless the caller pinned ``:now`` (Unix seconds; tests do).
CLOCK_SQL = f"coalesce(:now, {NOW_SQL})"


def _expand(sql: str) -> str:
    return (
        sql.replace("{now}", NOW_SQL)
        .replace("{clock}", CLOCK_SQL)
        .replace("{errors_plus_new}", ERRORS_PLUS_NEW_SQL)
        .replace("{serial_takeable}", SERIAL_TAKEABLE_SQL)
        .replace("{serial_unkeyed}", SERIAL_UNKEYED_SQL)
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
