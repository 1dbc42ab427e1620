"""How the PostgreSQL backend writes new jobs (internal): one statement for
one job, arrays for a batch with unique keys, COPY for a large batch, on its
own connection or in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from jobkeeper.backends.postgres.connections import PostgresConnections, describe, retrying
from jobkeeper.backends.postgres.direct import direct_statement, run_direct
from jobkeeper.backends.postgres.flow import FlowNeeded
from jobkeeper.backends.postgres.plan_runner import run_plan
from jobkeeper.backends.postgres.plans import (
    insert_plan,
    is_single_statement,
    read_for_insert,
)
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.postgres.session_setup import MisplacedTables, require_iso_datestyle
from jobkeeper.backends.postgres.sources import RETRY_ASKED, load_json_safely
from jobkeeper.backends.rows import job_from_new
from jobkeeper.errors import DatabaseError
from jobkeeper.models import Job, NewJob

#: The single enqueue's usual statement (see ``PostgresInserts._insert_now``).
INSERT_NOW = direct_statement("job_insert_many_now", QUERIES["job_insert_many_now"])


def insert_now_params(new: NewJob, channel: str) -> tuple[bytes | None, ...] | None:
    """``job_insert_many_now``'s parameters for ``new``, in text (see
    ``direct.py``), or None when ``new`` is not a job to run now without a
    key (:func:`~jobkeeper.backends.postgres.plans.is_single_statement`).
    ``channel``: where the insert announces the job's queue.
    """
    if not is_single_statement((new,)):
        return None
    trace = new.trace_context
    return (
        new.queue.encode(),
        new.task.encode(),
        new.args_json.encode(),
        b"%d" % new.priority,
        b"%d" % new.max_attempts,
        None if trace is None else trace.encode(),
        channel.encode(),
    )


def inserted_now(new: NewJob, rows: list[Any]) -> Job:
    """The Job ``job_insert_many_now`` stored for ``new`` (``rows``: what
    :func:`~jobkeeper.backends.postgres.direct.run_direct` returned); no row
    to decode, the args go back as the caller gave them, like the COPY
    path's.

    Raises:
        FlowNeeded: nothing was inserted: the queue has a ``max_pending``.
    """
    if not rows:
        raise FlowNeeded
    job_id, created_at, _ = rows[0]
    return job_from_new(new, job_id, created_at)


class PostgresInserts(PostgresConnections):
    """The insert paths behind ``job_insert_many``."""

    def job_insert_many(self, *, jobs: Sequence[NewJob], connection: Any = None) -> list[Job]:
        if not jobs:
            return []
        jobs = read_for_insert(jobs)
        channel = self.channel()  # looked up (once) before a cursor is held
        if connection is not None:
            return self._insert_on(connection, jobs, channel)

        # One statement (atomic on its own, no BEGIN/COMMIT round trips) when
        # it can be; a limited queue it meets makes it run again in a
        # transaction, with the flow checks (see plans.insert_plan).
        def insert_once(in_transaction: bool) -> list[Job]:
            with self._cursor(transaction=in_transaction) as cursor:
                plan = insert_plan(jobs, channel, in_transaction=in_transaction)
                stored: list[Job] = run_plan(cursor, plan, QUERIES)
                return stored

        def insert(in_transaction: bool) -> list[Job]:
            # One statement or one transaction: see _once_more.
            return self._once_more(insert_once, in_transaction)

        if len(jobs) == 1:
            new = jobs[0]
            now_params = insert_now_params(new, channel)
            if now_params is not None:
                try:
                    return retrying(lambda: self._once_more(self._insert_now, new, now_params))
                except FlowNeeded:
                    return retrying(lambda: insert(True))
        if is_single_statement(jobs):
            try:
                return retrying(lambda: insert(False))
            except FlowNeeded:
                pass
        return retrying(lambda: insert(True))

    def _insert_on(self, connection: Any, jobs: Sequence[NewJob], channel: str) -> list[Job]:
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

        require_iso_datestyle(connection)

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
                        if not own:  # a unique duplicate may be any stored row
                            load_json_safely(cur)
                        plan = insert_plan(jobs, channel, in_transaction=True)
                        stored: list[Job] = run_plan(cur, plan, QUERIES)
                        return stored
                except RETRY_ASKED as exc:
                    if own:
                        raise
                    raise DatabaseError(
                        f"PostgreSQL aborted the caller's transaction ({describe(exc)}): "
                        "roll it back and retry the whole transaction (none of it was committed)"
                    ) from exc

        return retrying(insert) if own else insert()

    def _insert_now(self, new: NewJob, params: tuple[bytes | None, ...]) -> list[Job]:
        """The usual single enqueue: ``new``, a job to run now without a key,
        with its :func:`insert_now_params`, sent through libpq itself
        (``direct.py``) with no plan to drive (a plan's generator and cursor
        were a tenth of the call's client time).

        Raises:
            FlowNeeded: the queue has a ``max_pending``; nothing was inserted.
        """
        with self._errors() as call, self._source.connection() as conn:
            call.checked_out = True
            call.connection = conn
            rows = run_direct(conn, INSERT_NOW, params)
        return [inserted_now(new, rows)]

    def _check_same_database(self, connection: psycopg.Connection[Any]) -> None:
        """Refuse a caller's connection to another database or schema."""
        if connection in self._checked_connections:
            return
        query = QUERIES["job_insert_many_same_database"]
        theirs = connection.execute(query).fetchone()
        ours = self._fetch_raw(query)[0]
        refuse_elsewhere(theirs, ours, self.url.migrate_hint())
        self._checked_connections.add(connection)


def refuse_elsewhere(theirs: Any, ours: Any, migrate_hint: str) -> None:
    """Refuse a caller's connection whose ``job_insert_many_same_database``
    row, ``theirs``, is not ``ours``: another database or schema, or a
    search path that finds jobkeeper's tables in another schema than its
    current one (the insert would land there; see ``session_setup``).

    Raises:
        TypeError: another database or schema.
        MisplacedSchemaError: the tables it would write are another schema's.
    """
    if theirs is None or ours is None or tuple(theirs[:2]) != tuple(ours[:2]):
        raise TypeError(
            f"connection= is open on database/schema {tuple((theirs or ())[:2])!r}, not on "
            f"this queue's {tuple((ours or ())[:2])!r}"
        )
    misplaced = MisplacedTables.of(found=theirs[2], current=theirs[1])
    if misplaced is not None:
        raise misplaced.error(migrate_hint)
