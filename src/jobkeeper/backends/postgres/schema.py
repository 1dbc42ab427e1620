"""The PostgreSQL backend's schema: ``migrate`` under its locks, the version
applied, and the indexes a version retired (internal).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from jobkeeper.backends.migrate import apply_migrations, unrecorded_schema
from jobkeeper.backends.postgres.connections import PostgresConnections
from jobkeeper.backends.postgres.queries import MIGRATIONS, QUERIES

logger = logging.getLogger("jobkeeper.postgres")

#: pg_advisory_xact_lock key serialising migrate() across processes
#: (the bytes of "jobkeepr" as a big-endian int64).
MIGRATION_LOCK_KEY = 0x6A6F626B65657072
#: ``(schema version, index, query)``: indexes that schema version replaced,
#: each dropped by its query after ``migrate`` commits.
RETIRED_INDEX_DROPS = ((14, "jobkeeper_jobs_serial_first_idx", "schema_drop_serial_first_index"),)


class PostgresSchema(PostgresConnections):
    """The ``migrate`` and ``schema_*`` operations of the PostgreSQL backend."""

    def migrate(self) -> int:
        # A schema made by this call, or by another migrate this one waited
        # on, has no one else's transactions to wait for: its retired indexes
        # (made, and dropped again by each) are not worth a warning. Read
        # before the lock for that only; the lock of the jobs table is decided
        # under it (before_applying).
        new_schema = self.schema_version() == 0
        with self._cursor(transaction=True) as cursor:

            def execute(statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                # No parameters: the simple protocol, which takes a whole
                # migration file of several statements at once.
                cursor.execute(statement, params or None)
                return cursor.fetchall() if cursor.description else []

            def before_applying(current: int) -> None:
                # The version read under the lock below: one read before it
                # could be overtaken by an older release's migrate, leaving
                # this one to migrate a schema in use without the table lock.
                if current > 0:
                    execute(QUERIES["schema_lock_jobs"], ())

            # Everything runs under one transaction-scoped lock, so concurrent
            # migrate() calls apply each migration exactly once.
            execute(QUERIES["schema_lock"], (MIGRATION_LOCK_KEY,))
            version = apply_migrations(execute, MIGRATIONS, QUERIES, before_applying)
        # Indexes a migration retired are dropped outside its transaction
        # (DROP INDEX CONCURRENTLY cannot run inside one), once the schema
        # that no longer needs them has committed. Each drop is idempotent,
        # and concurrent drops of one index all succeed.
        for retired_at, index, query in RETIRED_INDEX_DROPS:
            if (
                version >= retired_at
                and self._fetch_raw(QUERIES["schema_index_exists"], (index,))[0][0]
            ):
                # Said first: the drop may wait, silently, for a long
                # transaction of someone else's (or of this process's own).
                log = logger.debug if new_schema else logger.warning
                log(
                    "dropping index %s (replaced in schema version %d) concurrently: this "
                    "waits for the transactions open on jobkeeper_jobs to end",
                    index,
                    retired_at,
                )
                self._fetch_raw(QUERIES[query])
        return version

    def schema_version(self, *, lock_wait: float | None = None) -> int:
        with self._cursor(transaction=lock_wait is not None) as cursor:
            if lock_wait is not None:
                cursor.execute(QUERIES["schema_lock_wait"], (f"{round(lock_wait * 1000)}ms",))
            recorded, jobs = cursor.execute(QUERIES["schema_tables_exist"]).fetchall()[0]
            version = 0
            if recorded:
                version = int(cursor.execute(QUERIES["schema_version"]).fetchall()[0][0])
        if version == 0 and jobs:
            raise unrecorded_schema(self.schema_expected())
        return version

    def schema_expected(self) -> int:
        return int(MIGRATIONS[-1][0])
