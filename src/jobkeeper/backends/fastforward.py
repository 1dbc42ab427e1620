"""Test support: make scheduled and retrying jobs due now.

Internal, for :func:`jobkeeper.testing.drain` with ``include_scheduled=True``
only (Oban's ``drain_queue(with_scheduled: true)``): production code never
moves a job's time. One statement per backend, on a connection of its own
opened from the queue's URL, compared against the database clock; the
worker's own staging then makes the jobs available, as it would have at
their time.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from jobkeeper.config import DatabaseURL

# The scheduled_at of a job not yet due is moved to now; its status stays
# (scheduled or retryable) so that the worker's staging step is what makes it
# available, exactly as when its time comes.
_SQLITE = """
UPDATE jobkeeper_jobs
SET scheduled_at = (julianday('now') - 2440587.5) * 86400.0
WHERE status IN ('scheduled', 'retryable')
  AND scheduled_at > (julianday('now') - 2440587.5) * 86400.0
  AND queue IN (SELECT value FROM json_each(?))
"""

_POSTGRES = """
UPDATE jobkeeper_jobs
SET scheduled_at = now()
WHERE status IN ('scheduled', 'retryable') AND scheduled_at > now() AND queue = ANY(%s)
"""


def job_make_due(url: DatabaseURL, *, queues: Sequence[str], busy_timeout: float = 30.0) -> int:
    """Move every scheduled or retryable job of ``queues`` that is not yet due
    to now (database clock). Returns how many were moved.

    Args:
        url: the queue's database.
        queues: the queues whose jobs to move.
        busy_timeout: SQLite: seconds to wait for the write lock.
    """
    if url.scheme == "sqlite":
        conn = sqlite3.connect(url.path, timeout=busy_timeout)
        try:
            with conn:
                return conn.execute(_SQLITE, (json.dumps(list(queues)),)).rowcount
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url.url, autocommit=True) as pg:
        return pg.execute(_POSTGRES, (list(queues),)).rowcount
