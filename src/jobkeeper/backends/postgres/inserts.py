"""How the PostgreSQL backend writes new jobs (internal): one statement for
one job, arrays for a batch with unique keys, COPY for a large batch, on its
own connection or in the caller's transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from jobkeeper.backends.postgres.connections import (
    _RETRY_ASKED,
    PostgresConnections,
    _describe,
    _retrying,
    _rows,
)
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.rows import insert_params, job_from_new, match_inserted
from jobkeeper.errors import DatabaseError
from jobkeeper.models import Job, JobStatus, NewJob

#: Batches at least this large (and without unique keys) are written with COPY.
COPY_MIN_JOBS = 64


def _unique_lock_key(task: str, unique_key: str) -> int:
    """The advisory lock key of a (task, unique_key): a stable 64-bit hash
    (Python's ``hash`` differs between processes). A collision only makes two
    batches wait for each other; uniqueness itself is the index's.
    """
    digest = hashlib.blake2b(f"{task}\0{unique_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresInserts(PostgresConnections):
    """The insert paths behind ``job_insert_many``."""

    def _insert_on(self, connection: Any, jobs: Sequence[NewJob], channel: str | None) -> list[Job]:
        """``job_insert_many`` on the caller's connection (``connection=``)."""
        if not isinstance(connection, psycopg.Connection):
            raise TypeError(
                "connection= must be a psycopg 3 Connection to this database, got "
                f"{type(connection).__module__}.{type(connection).__name__}"
            )
        # On an autocommit connection the block below is a transaction of its
        # own, which may be run again; otherwise it is a savepoint in the
        # caller's transaction, which an abort ends whole.
        own = connection.autocommit

        def insert() -> list[Job]:
            with self._errors():
                self._check_same_database(connection)
                if not own:
                    # Make sure the caller's transaction is open, so that the
                    # block below is a savepoint inside it rather than a
                    # transaction of its own that would commit.
                    connection.execute(QUERIES["job_insert_many_open_transaction"])
                # A savepoint (or a transaction): a batch that fails part-way
                # leaves nothing behind.
                try:
                    with connection.transaction(), connection.cursor(row_factory=tuple_row) as cur:
                        return self._notify_due(cur, channel, self._insert(cur, jobs))
                except _RETRY_ASKED as exc:
                    if own:
                        raise
                    raise DatabaseError(
                        f"PostgreSQL aborted the caller's transaction ({_describe(exc)}): "
                        "roll it back and retry the whole transaction (none of it was committed)"
                    ) from exc

        return _retrying(insert) if own else insert()

    def _notify_due(
        self, cursor: psycopg.Cursor[Any], channel: str | None, jobs: list[Job]
    ) -> list[Job]:
        """Tell listening workers when the scheduled jobs among ``jobs`` come
        due (one NOTIFY per queue, in the insert's transaction), so that they
        stage them then rather than at their next poll. Returns ``jobs``.
        """
        due: dict[str, datetime] = {}
        for job in jobs:
            if job.status == JobStatus.SCHEDULED:
                due[job.queue] = min(due.get(job.queue, job.scheduled_at), job.scheduled_at)
        if channel is not None and due:
            cursor.execute(
                QUERIES["notify_due"],
                {"channel": channel, "queues": list(due), "due_ats": list(due.values())},
            )
        return jobs

    def _check_same_database(self, connection: psycopg.Connection[Any]) -> None:
        """Refuse a caller's connection to another database or schema."""
        if connection in self._checked_connections:
            return
        query = QUERIES["job_insert_many_same_database"]
        theirs = connection.execute(query).fetchone()
        ours = self._fetch_raw(query)[0]
        if theirs is None or tuple(theirs) != tuple(ours):
            raise TypeError(
                f"connection= is open on database/schema {tuple(theirs or ())!r}, not on "
                f"this queue's {tuple(ours)!r}"
            )
        self._checked_connections.add(connection)

    def _insert(self, cursor: psycopg.Cursor[Any], jobs: Sequence[NewJob]) -> list[Job]:
        if len(jobs) >= COPY_MIN_JOBS and all(job.unique_key is None for job in jobs):
            return self._insert_copy(cursor, jobs)
        if len(jobs) == 1 and jobs[0].unique_key is None:
            return [self._insert_one(cursor, jobs[0])]
        lock_keys = sorted(
            {_unique_lock_key(j.task, j.unique_key) for j in jobs if j.unique_key is not None}
        )
        if len(lock_keys) > 1:
            # Rows go in input order (ids ascend with it), so two batches
            # holding the same keys in different orders would each wait in
            # the unique index for a key the other took first: a deadlock.
            # The locks are taken in one order for all batches instead.
            cursor.execute(QUERIES["job_insert_many_lock_keys"], {"keys": lock_keys})
        out: list[Job | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        # A duplicate can finish between the skipped insert and the lookup;
        # then the key is free again and the next round inserts it.
        for _ in range(5):
            batch = [jobs[i] for i in pending]
            cursor.execute(
                QUERIES["job_insert_many"],
                {
                    "queues": [j.queue for j in batch],
                    "tasks": [j.task for j in batch],
                    "args": [j.args_json for j in batch],
                    "priorities": [j.priority for j in batch],
                    "max_attempts": [j.max_attempts for j in batch],
                    "delays": [j.delay for j in batch],
                    "run_ats": [j.run_at for j in batch],
                    "unique_keys": [j.unique_key for j in batch],
                },
            )
            inserted = self._jobs(_rows(cursor))
            existing: dict[tuple[str, str], Job] = {}
            if len(inserted) < len(batch):
                keyed = [j for j in batch if j.unique_key is not None]
                cursor.execute(
                    QUERIES["job_insert_many_pending"],
                    {
                        "tasks": [j.task for j in keyed],
                        "unique_keys": [j.unique_key for j in keyed],
                    },
                )
                for job in self._jobs(_rows(cursor)):
                    assert job.unique_key is not None
                    existing[(job.task, job.unique_key)] = job
            matched, unresolved = match_inserted(batch, inserted, existing)
            for position, matched_job in zip(pending, matched, strict=True):
                out[position] = matched_job
            pending = [pending[i] for i in unresolved]
            if not pending:
                return [job for job in out if job is not None]
        raise DatabaseError("could not resolve unique_key conflicts after 5 rounds")

    def _insert_one(self, cursor: psycopg.Cursor[Any], new: NewJob) -> Job:
        """The single enqueue: one statement, and no row to decode (the args
        go back as the caller gave them, like the COPY path's).
        """
        cursor.execute(QUERIES["job_insert_many_one"], insert_params(new, new.run_at))
        row = cursor.fetchone()
        assert row is not None
        job_id, status, scheduled_at, created_at = row
        return job_from_new(
            new,
            job_id,
            created_at.astimezone(UTC),
            (JobStatus(status), scheduled_at.astimezone(UTC)),
        )

    def _insert_copy(self, cursor: psycopg.Cursor[Any], jobs: Sequence[NewJob]) -> list[Job]:
        """Bulk insert with COPY (no unique keys to resolve): three round trips
        whatever the count. The insert trigger still sends one NOTIFY per queue.
        """
        cursor.execute(QUERIES["job_insert_many_reserve_ids"], {"count": len(jobs)})
        row = cursor.fetchone()
        assert row is not None
        now, ids = row[0].astimezone(UTC), row[1]
        built = [job_from_new(new, job_id, now) for new, job_id in zip(jobs, ids, strict=True)]
        pairs = list(zip(jobs, built, strict=True))
        immediate = [(new, job) for new, job in pairs if new.delay is None and new.run_at is None]
        if immediate:
            with cursor.copy(QUERIES["job_insert_many_copy"]) as copy:
                for new, job in immediate:
                    copy.write_row(
                        (job.id, new.queue, new.task, new.args_json, new.priority, new.max_attempts)
                    )
        if len(immediate) < len(pairs):
            with cursor.copy(QUERIES["job_insert_many_copy_scheduled"]) as copy:
                for new, job in pairs:
                    if new.delay is not None or new.run_at is not None:
                        copy.write_row(
                            (job.id, new.queue, new.task, new.args_json, job.status.value,
                             new.priority, new.max_attempts, job.scheduled_at, now)
                        )  # fmt: skip
        return built
