"""The SQLite backend's ``migrate`` and ``schema_*`` operations (internal)."""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from jobkeeper.backends.migrate import SchemaLockTimeoutError, apply_migrations, unrecorded_schema
from jobkeeper.backends.sqlite.connection import SqliteConnection, _is_locked
from jobkeeper.backends.sqlite.queries import MIGRATIONS, QUERIES
from jobkeeper.config import MIGRATE_LOCK_WAIT
from jobkeeper.errors import DatabaseUnavailable

logger = logging.getLogger("jobkeeper.sqlite")

#: Seconds ``migrate`` waits for the write lock before it says that it waits.
SAY_WAITING_AFTER = 2.0


class SqliteSchema(SqliteConnection):
    """The ``migrate`` and ``schema_*`` operations of the SQLite backend."""

    def migrate(self, *, lock_wait: float = MIGRATE_LOCK_WAIT) -> int:
        # A writer waiting here queues no one behind it (each polls the lock
        # on its own), so one long wait harms no enqueue; but it was silent
        # for busy_timeout, then failed. After a short try, it says so.
        first = min(lock_wait, SAY_WAITING_AFTER)
        try:
            return self._migrate_once(first)
        except DatabaseUnavailable as exc:
            if not self._write_lock_busy(exc):
                raise
            if lock_wait <= first:
                raise self._lock_timeout(lock_wait) from exc
        logger.warning(
            "migrate is waiting for the write lock of %s, held by another connection's "
            "write transaction (SQLite does not say whose: a long transaction of a job or "
            "of the application, a backup, a sqlite3 shell); for up to %.0f s more (lock_wait)",
            self.path,
            lock_wait - first,
        )
        try:
            return self._migrate_once(lock_wait - first)
        except DatabaseUnavailable as exc:
            if self._write_lock_busy(exc):
                raise self._lock_timeout(lock_wait) from exc
            raise

    def _migrate_once(self, lock_wait: float) -> int:
        with self._write(create=True, lock_wait=lock_wait) as conn:

            def execute(statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                return conn.execute(statement, params).fetchall()

            return apply_migrations(
                execute, MIGRATIONS, QUERIES, migrate_hint=self.url.migrate_hint()
            )

    @staticmethod
    def _write_lock_busy(exc: DatabaseUnavailable) -> bool:
        cause = exc.__cause__
        return isinstance(cause, sqlite3.OperationalError) and _is_locked(cause)

    def _lock_timeout(self, lock_wait: float) -> SchemaLockTimeoutError:
        return SchemaLockTimeoutError(
            f"migrate gave up after {lock_wait:g} s (lock_wait) waiting for the write lock of "
            f"{self.path!r}, held all along by another connection's write transaction; "
            "nothing was changed. End that transaction and run migrate again, or give it "
            "longer (jobkeeper migrate --lock-wait SECONDS)"
        )

    def schema_version(self, *, lock_wait: float | None = None) -> int:
        # lock_wait is PostgreSQL's: a read here (WAL) never waits on a writer.
        if not os.path.exists(self.path):
            return 0
        with self._errors():
            conn = self._conn()
            recorded, jobs = conn.execute(QUERIES["schema_tables_exist"]).fetchone()
            version = int(conn.execute(QUERIES["schema_version"]).fetchone()[0]) if recorded else 0
        if version == 0 and jobs:
            raise unrecorded_schema(self.schema_expected(), self.url.migrate_hint())
        return version

    def schema_expected(self) -> int:
        return int(MIGRATIONS[-1][0])
