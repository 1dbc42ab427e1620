"""SQLite wake-ups for ``wait`` (internal): SQLite has no NOTIFY, so one
connection per process and database file reads ``PRAGMA data_version``
every ``DATA_VERSION_POLL`` seconds; the value changes when any other
connection (of this process or another) commits. Only then does it read,
in one query, which of the awaited jobs are still pending, and wakes the
waiters of the others. A waiter never polls the database itself.
"""

from __future__ import annotations

import json
import sqlite3
import time

from jobkeeper.backends.sqlite.queries import QUERIES
from jobkeeper.backends.watch import CompletionWatch, watch_for

#: Seconds between two reads of data_version (a read costs microseconds and
#: takes no lock). Also the worst delay between a commit and its wake-up.
DATA_VERSION_POLL = 0.005


class _DataVersionSource:
    def __init__(self, path: str, busy_timeout: float) -> None:
        self._path = path
        self._busy_timeout = busy_timeout

    def run(self, watch: CompletionWatch) -> None:
        conn = sqlite3.connect(self._path, timeout=self._busy_timeout, isolation_level=None)
        try:
            seen: int | None = None
            watch.set_ready(True)
            while not watch.should_stop():
                version = int(conn.execute("PRAGMA data_version").fetchone()[0])
                ids = watch.waiting_ids()
                # New waiters read the job themselves after registering; only
                # a commit since the last look can have ended theirs.
                if version != seen:
                    seen = version
                    ended = self._ended(conn, ids)
                    if ended:
                        watch.deliver(ended)
                time.sleep(DATA_VERSION_POLL)
        finally:
            watch.set_ready(False)
            conn.close()

    @staticmethod
    def _ended(conn: sqlite3.Connection, ids: list[int]) -> list[int]:
        """The ids among ``ids`` that are no longer pending (finished, dead or gone)."""
        rows = conn.execute(QUERIES["completion_watch_pending"], {"ids": json.dumps(ids)})
        pending = {row[0] for row in rows}
        return [job_id for job_id in ids if job_id not in pending]


class SqliteWaiting:
    """The waiting half of the SQLite backend (mixed into it)."""

    path: str
    busy_timeout: float

    def job_mark_awaited(self, *, job_id: int) -> None:
        """Nothing to mark: the data_version watch needs no flag."""

    def completion_watch(self) -> CompletionWatch:
        path, timeout = self.path, self.busy_timeout
        return watch_for(f"sqlite:{path}", lambda: _DataVersionSource(path, timeout), "sqlite")
