"""How the SQLite backend writes new jobs (internal): row by row when unique
keys must be resolved, with executemany otherwise, on its own connection or
in the caller's transaction.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jobkeeper.backends.rows import (
    insert_params,
    jobs_from_new,
    match_inserted,
    schedule_of,
)
from jobkeeper.backends.sqlite.connection import SqliteConnection, _rows
from jobkeeper.backends.sqlite.queries import QUERIES
from jobkeeper.errors import DatabaseError, DatabaseReplaced
from jobkeeper.models import Job, NewJob


class SqliteInserts(SqliteConnection):
    """The insert paths behind ``job_insert_many``."""

    def _check_same_database(self, connection: Any) -> None:
        if not isinstance(connection, sqlite3.Connection):
            raise TypeError(
                "connection= must be a sqlite3.Connection to the same database file, got "
                f"{type(connection).__module__}.{type(connection).__name__}"
            )
        with self._errors():
            rows = connection.execute(QUERIES["job_insert_many_same_database"]).fetchall()
        main = next((row[2] for row in rows if row[1] == "main"), "")
        if not main or os.path.realpath(main) != os.path.realpath(self.path):
            raise TypeError(
                f"connection= is open on {main or 'an in-memory database'!r}, "
                f"not on this queue's database {self.path!r}"
            )
        # sqlite3 cannot say which file the caller's connection has open (no
        # fstat; nor can it be remembered, not being weakly referable), so a
        # file replaced under it goes unseen; but with no file at the path,
        # the one it has open was removed. One stat, before anything is written.
        try:
            os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            raise DatabaseReplaced(
                f"SQLite database {self.path!r} was removed while connection= had it open; the "
                "job was not written (the caller's transaction is on the removed file: its "
                "commit would not be stored either)",
                path=self.path,
            ) from None
        except OSError:
            pass  # unreadable now: the insert says what is wrong

    def _insert_in_caller(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> list[Job]:
        """Insert on the caller's connection as one unit.

        A savepoint undoes a failed batch without touching the rest of the
        caller's transaction (so a caught error cannot commit half a batch).
        On an autocommit connection the savepoint is a transaction of its own,
        committed here: the write lock is held for the whole batch, so it is
        never half-written and the bulk path's ids stay consecutive.
        """
        autocommit = conn.isolation_level is None or getattr(conn, "autocommit", None) is True
        if not autocommit and not conn.in_transaction:
            # What sqlite3 itself would issue before the first INSERT; without
            # it, releasing the savepoint would commit the caller's work.
            conn.execute(f"BEGIN {conn.isolation_level}")
        conn.execute("SAVEPOINT jobkeeper_enqueue")
        try:
            out = self._insert(conn, jobs)
        except BaseException:
            conn.execute("ROLLBACK TO jobkeeper_enqueue")
            conn.execute("RELEASE jobkeeper_enqueue")
            raise
        conn.execute("RELEASE jobkeeper_enqueue")
        return out

    if TYPE_CHECKING:  # the backend's flow mixin supplies it

        def _flow_check(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> None: ...

    def _insert(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> list[Job]:
        out, added = self._insert_rows(conn, jobs)
        # Serial-key marks and max_pending after the rows are in, so the
        # first statement is a write: on a caller's deferred transaction a
        # read first would let another writer in before our write lock (and
        # our write then fail on a stale snapshot). A refusal rolls it all
        # back. Only the rows added count: a pending duplicate adds none.
        self._flow_check(conn, added)
        return out

    def _insert_rows(
        self, conn: sqlite3.Connection, jobs: Sequence[NewJob]
    ) -> tuple[list[Job], list[NewJob]]:
        """The stored Jobs in input order, and the jobs whose rows were added."""
        if len(jobs) > 1 and all(new.unique_key is None and new.serial_key is None for new in jobs):
            return self._insert_bulk(conn, jobs), list(jobs)
        out: list[Job] = []
        added: list[NewJob] = []
        insert = QUERIES["job_insert_many"]
        for new in jobs:
            params = insert_params(new, new.run_at.timestamp() if new.run_at else None)
            inserted = self._jobs(_rows(conn.execute(insert, params)))
            existing: dict[tuple[str, str], Job] = {}
            if not inserted and new.unique_key is not None:
                # The write lock is ours, so the duplicate cannot finish meanwhile.
                found = _rows(
                    conn.execute(
                        QUERIES["job_insert_many_pending"],
                        {"task": new.task, "unique_key": new.unique_key},
                    )
                )
                existing = {(new.task, new.unique_key): self._jobs(found)[0]}
            matched, unresolved = match_inserted([new], inserted, existing)
            if unresolved or matched[0] is None:
                raise DatabaseError(
                    f"unique_key {new.unique_key!r}: conflict without a pending job"
                )
            out.append(matched[0])
            if inserted:
                added.append(new)
        return out, added

    def _insert_bulk(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> list[Job]:
        """Insert with executemany, without RETURNING (no unique keys to resolve).

        The write lock is held from the first insert to the commit and
        AUTOINCREMENT takes max + 1, so the ids are consecutive and end at
        ``last_insert_rowid()``. The Jobs are built from the input and the
        clock read in the same transaction, which is also what is stored.
        """
        now_epoch = float(conn.execute(QUERIES["db_now"]).fetchone()[0])
        now = datetime.fromtimestamp(now_epoch, UTC)
        rows = []
        for new in jobs:
            status, scheduled_at = schedule_of(new, now)
            scheduled_epoch = now_epoch if scheduled_at is now else scheduled_at.timestamp()
            rows.append(
                (new.queue, new.task, new.args_json, status.value, new.priority,
                 new.max_attempts, scheduled_epoch, now_epoch, new.trace_context, new.queue)
            )  # fmt: skip
        conn.executemany(QUERIES["job_insert_many_bulk"], rows)
        last = int(conn.execute(QUERIES["job_insert_many_last_id"]).fetchone()[0])
        first = last - len(jobs) + 1
        return jobs_from_new(jobs, range(first, last + 1), now)
