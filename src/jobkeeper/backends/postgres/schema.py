"""The PostgreSQL backend's schema: ``migrate`` under its locks, the version
applied, and the indexes a version retired (internal).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from jobkeeper.backends.migrate import (
    MisplacedSchemaError,
    SchemaLockTimeoutError,
    apply_migrations,
    unrecorded_schema,
)
from jobkeeper.backends.postgres.connections import PostgresConnections, no_schema, rows_of
from jobkeeper.backends.postgres.queries import MIGRATIONS, QUERIES
from jobkeeper.backends.postgres.session_setup import misplaced_tables
from jobkeeper.config import MIGRATE_LOCK_WAIT
from jobkeeper.errors import DatabaseError, DatabaseUnavailable, query_excerpt

logger = logging.getLogger("jobkeeper.postgres")

#: What a schema's migration lock key is derived from (see
#: :func:`migration_lock_key`).
MIGRATION_LOCK_PREFIX = b"jobkeeper migrate\0"
#: ``(schema version, index, query)``: indexes that schema version replaced,
#: each dropped by its query after ``migrate`` commits.
RETIRED_INDEX_DROPS = ((14, "jobkeeper_jobs_serial_first_idx", "schema_drop_serial_first_index"),)
#: Seconds one attempt of ``migrate`` waits for a lock of a table: while it
#: waits for the jobs table's, every enqueue and claim waits behind it.
LOCK_TIMEOUT = 1.0
#: Seconds between attempts, doubled after each up to ``LONGEST_PAUSE``
#: (jittered by a quarter, so two migrates drift apart): the fleet works then.
FIRST_PAUSE = 1.0
LONGEST_PAUSE = 10.0


def migration_lock_key(schema: str) -> int:
    """The pg_advisory_xact_lock key serialising migrate() of ``schema``
    across processes: one per schema, so that migrates of jobkeeper's tables
    in other schemas of the database neither wait for it nor are named as
    what it waits for.
    """
    digest = hashlib.blake2b(MIGRATION_LOCK_PREFIX + schema.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class LockWaitError(Exception):
    """An attempt of ``migrate`` that met its lock_timeout (internal):
    ``advisory`` when it waited for the migration lock ``key`` (another
    migrate), else for a table's.
    """

    def __init__(self, *, advisory: bool, key: int) -> None:
        super().__init__("lock wait timed out")
        self.advisory = advisory
        self.key = key


def terminate_hint(holders: list[dict[str, Any]]) -> str:
    """How to end the oldest holder's session, for migrate's error ("" when
    none is left).
    """
    return f"(SELECT pg_terminate_backend({holders[0]['pid']})) " if holders else ""


def held_by(holders: list[dict[str, Any]]) -> str:
    """The sessions of ``schema_lock_holders`` in words, the oldest
    transaction first (the one to end), for migrate's messages.
    """
    if not holders:
        return "a session whose transaction has ended since"
    oldest = holders[0]
    query = query_excerpt(oldest["query"], 80)
    name = f"{oldest['application_name']}, " if oldest["application_name"] else ""
    open_for = oldest["open_for"]
    # A transaction begun after this one read now() shows a negative age.
    opened = f"transaction open {max(open_for, 0.0):.0f} s, " if open_for is not None else ""
    others = f" (and {len(holders) - 1} other session(s))" if len(holders) > 1 else ""
    state = oldest["state"] or "state unknown"
    return f"pid {oldest['pid']} ({name}{state}, {opened}{query!r}){others}"


class PostgresSchema(PostgresConnections):
    """The ``migrate`` and ``schema_*`` operations of the PostgreSQL backend."""

    def migrate(self, *, lock_wait: float = MIGRATE_LOCK_WAIT) -> int:
        # A schema made by this call, or by another migrate this one waited
        # on, has no one else's transactions to wait for: its retired indexes
        # (made, and dropped again by each) are not worth a warning. Read
        # before the lock for that only; the lock of the jobs table is decided
        # under it (before_applying).
        try:
            new_schema = self.schema_version() == 0
        except MisplacedSchemaError:
            new_schema = True  # the current schema has no tables yet
        started = time.monotonic()
        pause = FIRST_PAUSE
        while True:
            remaining = lock_wait - (time.monotonic() - started)
            try:
                version = self._once_more(self._migrate_once, remaining)
                break
            except LockWaitError as waited:
                remaining = lock_wait - (time.monotonic() - started)
                holders = self._lock_holders(advisory=waited.advisory, key=waited.key)
                what = "the migration lock" if waited.advisory else "a lock on jobkeeper's tables"
                if remaining <= 0:
                    raise SchemaLockTimeoutError(
                        f"migrate gave up after {time.monotonic() - started:.0f} s waiting for "
                        f"{what} (lock_wait={lock_wait:g} s), held by "
                        f"{held_by(holders)}; nothing was changed, the schema is still at "
                        f"version {self._version_or_unknown()}. End that transaction "
                        f"{terminate_hint(holders)}and run migrate again, or give it longer "
                        "(jobkeeper migrate --lock-wait SECONDS)"
                    ) from None
                wait = min(remaining, pause * random.uniform(0.75, 1.25))
                logger.warning(
                    "migrate is waiting for %s, held by %s; enqueues and claims go on "
                    "meanwhile: trying again in %.1f s, for up to %.1f s more (lock_wait)",
                    what,
                    held_by(holders),
                    wait,
                    remaining,
                )
                time.sleep(wait)
                pause = min(pause * 2, LONGEST_PAUSE)
        self._drop_retired_indexes(version, new_schema=new_schema)
        return version

    def _migrate_once(self, remaining: float) -> int:
        """One attempt at ``migrate``'s transaction.

        Raises:
            LockWaitError: a lock was not granted in time; the transaction
                was rolled back, nothing of it written.
        """
        waiting_for_advisory = True
        key = 0
        try:
            with self._cursor(transaction=True) as cursor:

                def execute(statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                    # No parameters: the simple protocol, which takes a whole
                    # migration file of several statements at once.
                    cursor.execute(statement, params or None)
                    return cursor.fetchall() if cursor.description else []

                def lock_wait(seconds: float) -> None:
                    execute(QUERIES["schema_lock_wait"], (f"{max(1, round(seconds * 1000))}ms",))

                def before_applying(current: int) -> None:
                    # The version read under the lock below: one read before it
                    # could be overtaken by an older release's migrate, leaving
                    # this one to migrate a schema in use without the table lock.
                    if current > 0:
                        execute(QUERIES["schema_lock_jobs"], ())

                # Everything runs under one transaction-scoped lock, so
                # concurrent migrate() calls apply each migration exactly
                # once. Waiting for it holds up no enqueue or claim: the
                # whole of lock_wait. Said first when another migrate has it.
                key = migration_lock_key(execute(QUERIES["schema_current"], ())[0][0] or "")
                if not execute(QUERIES["schema_lock_try"], (key,))[0][0]:
                    # Read on this connection: another one from the pool
                    # would wait for ever with pool_size=1.
                    logger.warning(
                        "migrate is waiting for another migrate, %s, to finish",
                        held_by(self._lock_holders(advisory=True, key=key, cursor=cursor)),
                    )
                    lock_wait(remaining)
                    execute(QUERIES["schema_lock"], (key,))
                waiting_for_advisory = False
                # A lock request waiting on the jobs table queues every later
                # one behind it: each enqueue and claim of the fleet waited as
                # long as a transaction of someone else's stayed open (43 s
                # behind a pg_sleep). Every lock of the migration, the jobs
                # table's and the ALTERs' of other tables, waits this long at
                # most; then all is rolled back, and tried again after a pause
                # in which the fleet works.
                lock_wait(min(LOCK_TIMEOUT, max(remaining, 0.001)))
                return apply_migrations(
                    execute,
                    MIGRATIONS,
                    QUERIES,
                    before_applying,
                    migrate_hint=self.url.migrate_hint(),
                )
        except DatabaseUnavailable as exc:
            if isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise LockWaitError(advisory=waiting_for_advisory, key=key) from exc
            raise

    def _version_or_unknown(self) -> str:
        try:
            return str(self.schema_version(lock_wait=LOCK_TIMEOUT))
        except DatabaseError:
            return "(unread)"

    def _lock_holders(
        self, *, advisory: bool, key: int, cursor: psycopg.Cursor[Any] | None = None
    ) -> list[dict[str, Any]]:
        """The sessions holding what migrate waits for (``schema_lock_holders``,
        with the migration lock ``key``), read on ``cursor`` when given, else
        on a pooled connection.
        """
        params = {"advisory": advisory, "key": key}
        if cursor is None:
            return self._fetch("schema_lock_holders", params)
        cursor.execute(QUERIES["schema_lock_holders"], params)
        return rows_of(cursor)

    def _drop_retired_indexes(self, version: int, *, new_schema: bool) -> None:
        # Indexes a migration retired are dropped outside its transaction
        # (DROP INDEX CONCURRENTLY cannot run inside one), once the schema
        # that no longer needs them has committed. Each drop is idempotent,
        # and concurrent drops of one index all succeed. The drop blocks no
        # enqueue or claim (SHARE UPDATE EXCLUSIVE), so it is not bounded.
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

    def schema_version(self, *, lock_wait: float | None = None) -> int:
        return self._once_more(self._schema_version_once, lock_wait)

    def _schema_version_once(self, lock_wait: float | None) -> int:
        with self._cursor(transaction=lock_wait is not None) as cursor:
            if lock_wait is not None:
                cursor.execute(QUERIES["schema_lock_wait"], (f"{round(lock_wait * 1000)}ms",))
            recorded, jobs, no_schema_exists = cursor.execute(
                QUERIES["schema_tables_exist"]
            ).fetchall()[0]
            if no_schema_exists:
                raise no_schema(self.url, "the search path names no schema that exists")
            version = 0
            if recorded:
                version = int(cursor.execute(QUERIES["schema_version"]).fetchall()[0][0])
            misplaced = misplaced_tables(cursor.connection)
        if version == 0 and jobs:
            raise unrecorded_schema(self.schema_expected(), self.url.migrate_hint())
        if version == 0 and misplaced is not None:
            raise misplaced.error(self.url.migrate_hint())
        return version

    def schema_expected(self) -> int:
        return int(MIGRATIONS[-1][0])
