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
#: The columns of a job row this version reads (rows.job_from_row), named in
#: every statement that returns whole rows: a prepared statement's result
#: must not change when a later migration adds a column.
JOB_COLUMNS = (
    "id", "queue", "task", "args", "status", "priority", "attempt", "max_attempts",
    "scheduled_at", "created_at", "attempted_at", "finished_at", "worker_id", "unique_key",
    "errors", "result", "cancel_requested", "fence", "unstarted_returns", "awaited",
    "serial_key", "trace_context", "run_alone", "alone_fence", "crashes",
)  # fmt: skip
#: Columns of a job row that only this version's SQL reads, never a Job:
#: serial_unkeyed (migration 0017) serves the serial claim's index.
JOB_COLUMNS_SQL_ONLY = ("serial_unkeyed",)
#: The columns of a dead letter this version reads.
DEAD_LETTER_COLUMNS = (
    "id", "queue", "task", "args", "priority", "attempt", "max_attempts", "scheduled_at",
    "created_at", "attempted_at", "finished_at", "unique_key", "errors", "result", "reason",
    "serial_key", "crashes", "fence",
)  # fmt: skip
_PLACEHOLDERS = {
    "{utc_now_text}": UTC_NOW_TEXT_SQL,
    "{clock}": CLOCK_SQL,
    "{job_columns}": ", ".join(JOB_COLUMNS),
    "{job_columns_qualified}": ", ".join(f"job.{column}" for column in JOB_COLUMNS),
    "{dead_letter_columns}": ", ".join(DEAD_LETTER_COLUMNS),
}


def _filled(text: str) -> str:
    for placeholder, sql in _PLACEHOLDERS.items():
        text = text.replace(placeholder, sql)
    return text


QUERIES = {
    name: _filled(text) for name, text in load_queries("jobkeeper.backends.postgres").items()
}
#: Each migration file runs as one statement (PostgreSQL takes several at once).
MIGRATIONS = [
    (version, [script])
    for version, script in load_migrations("jobkeeper.backends.postgres.migrations")
]
