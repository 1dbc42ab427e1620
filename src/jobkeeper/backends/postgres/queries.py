"""The PostgreSQL backend's SQL, loaded once at import (internal).

Every statement the backend runs is a named block of ``queries.sql``; the
migrations are the ``migrations/NNNN_*.sql`` files.
"""

from __future__ import annotations

from jobkeeper.backends.sqlfile import load_migrations, load_queries

UTC_NOW_TEXT_SQL = """to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
#: The clock of a time-dependent operation: the database's (guarantee 7),
#: unless the caller pinned ``now`` (tests do; River's ``sqlc.narg('now')``).
CLOCK_SQL = "coalesce(%(now)s::timestamptz, now())"
QUERIES = {
    name: text.replace("{utc_now_text}", UTC_NOW_TEXT_SQL).replace("{clock}", CLOCK_SQL)
    for name, text in load_queries("jobkeeper.backends.postgres").items()
}
#: Each migration file runs as one statement (PostgreSQL takes several at once).
MIGRATIONS = [
    (version, [script])
    for version, script in load_migrations("jobkeeper.backends.postgres.migrations")
]
