"""Running the sans-IO plans of ``plans`` on psycopg cursors (internal):
``run_plan`` on a sync ``Cursor``, ``run_plan_async`` on an ``AsyncCursor``,
each leaving the connection settled when a step is interrupted.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from psycopg import pq
from psycopg.generators import fetch_many

from jobkeeper.backends.postgres.plans import Copy, CopyText, Plan


def _names(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> list[str] | None:
    # Column names straight from the result: cursor.description builds a
    # Column object per column on every call.
    result = cursor.pgresult
    if result is None or result.nfields == 0:
        return None
    return [(result.fname(i) or b"").decode() for i in range(result.nfields)]


#: Cursors that refuse binary results (psycopg's client-side cursors:
#: Django's connection uses one, and so may a caller's ``cursor_factory``).
_TEXT_ONLY = (psycopg.ClientCursor, psycopg.AsyncClientCursor)


def _binary(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any], wanted: bool) -> bool:
    """Whether a step that asks for binary results gets them on ``cursor``;
    otherwise its text decodes to the same values.
    """
    return wanted and not isinstance(cursor, _TEXT_ONLY)


def _send_buffered(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Hand the socket what libpq still buffers of a COPY's data (it sends
    in 8 kB blocks), so the server inserts every row while the client does
    its own work; a socket that takes less now gets the rest at COPY's end.
    """
    cursor.connection.pgconn.flush()


#: What an interrupted COPY is ended with (CopyFail): the server drops
#: what it received, and the transaction fails.
_COPY_INTERRUPTED = b"interrupted by the client: nothing of this COPY is kept"
#: Seconds an interrupted step's statement gets to answer before it is
#: cancelled, and then to answer the cancel.
_SETTLE_WAIT = 1.0
_SETTLE_ROUNDS = 3


def _settle(cursor: psycopg.Cursor[Any]) -> None:
    """After an exception left a plan step: if the connection is still busy
    with the step's statement, end a COPY still open with CopyFail and read
    the server's answers (cancelling a statement that gives none within
    ``_SETTLE_WAIT``).

    An interruption (Ctrl-C, an asyncio cancellation) that lands between
    psycopg's sending a statement, a COPY's start or its end and its reading
    the reply leaves the connection so. The transaction's rollback then
    failed ("another command is already in progress") and the pool threw the
    connection away, each with a warning. Settled, the transaction is
    failed and its rollback works. Whatever fails here leaves the connection
    as it was: the pool replaces it.
    """
    conn = cursor.connection
    pgconn = conn.pgconn
    # Up to three reads: a COPY whose start was sent but not yet answered
    # takes one to open (its CopyFail is refused until then) and one to end.
    for _ in range(_SETTLE_ROUNDS):
        if pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
            return
        with contextlib.suppress(psycopg.Error):  # refused when no COPY is open
            pgconn.put_copy_end(_COPY_INTERRUPTED)
        with contextlib.suppress(psycopg.Error):
            pgconn.flush()
            conn.wait(fetch_many(pgconn), timeout=_SETTLE_WAIT)
    if pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
        with contextlib.suppress(psycopg.Error):
            conn.cancel_safe(timeout=_SETTLE_WAIT)
            conn.wait(fetch_many(pgconn), timeout=_SETTLE_WAIT)


async def _settle_async(cursor: psycopg.AsyncCursor[Any]) -> None:
    """:func:`_settle` on an async cursor."""
    conn = cursor.connection
    pgconn = conn.pgconn
    for _ in range(_SETTLE_ROUNDS):
        if pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
            return
        with contextlib.suppress(psycopg.Error):
            pgconn.put_copy_end(_COPY_INTERRUPTED)
        with contextlib.suppress(psycopg.Error):
            pgconn.flush()
            await conn.wait(fetch_many(pgconn), timeout=_SETTLE_WAIT)
    if pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
        with contextlib.suppress(psycopg.Error):
            await conn.cancel_safe(timeout=_SETTLE_WAIT)
            await conn.wait(fetch_many(pgconn), timeout=_SETTLE_WAIT)


def run_plan(cursor: psycopg.Cursor[Any], plan: Plan, queries: dict[str, str]) -> Any:
    """Drive ``plan`` on a sync cursor (tuple rows); returns what it returns.
    An exception leaves the connection settled (:func:`_settle`).
    """
    try:
        return _run_steps(cursor, plan, queries)
    except BaseException:
        _settle(cursor)
        raise


def _run_steps(cursor: psycopg.Cursor[Any], plan: Plan, queries: dict[str, str]) -> Any:
    reply: list[Any] | None = None
    while True:
        try:
            step = plan.send(reply) if reply is not None else next(plan)
        except StopIteration as stop:
            return stop.value
        if isinstance(step, Copy):
            with cursor.copy(queries[step.query]) as copy:
                for row in step.rows:
                    copy.write_row(row)
            reply = []
            continue
        if isinstance(step, CopyText):
            with cursor.copy(queries[step.query]) as copy:
                for chunk in step.chunks:
                    copy.write(chunk)
                _send_buffered(cursor)
                step.meanwhile()
            reply = []
            continue
        binary = _binary(cursor, step.binary)
        if step.meanwhile is not None and _pipelines(cursor):
            # Sent at once and its reply read after: the server runs the
            # statement while the client does the step's own work.
            with cursor.connection.pipeline():
                cursor.execute(queries[step.query], step.params, binary=binary)
                cursor.connection.pgconn.flush()
                step.meanwhile()
                rows = cursor.fetchall()
                names = _names(cursor)
        else:
            cursor.execute(queries[step.query], step.params, binary=binary)
            if step.meanwhile is not None:
                step.meanwhile()
            names = _names(cursor)
            rows = cursor.fetchall() if names is not None else []
        if names is None:
            reply = []
        elif step.tuples:
            reply = rows
        else:
            reply = [dict(zip(names, r, strict=True)) for r in rows]


async def run_plan_async(
    cursor: psycopg.AsyncCursor[Any], plan: Plan, queries: dict[str, str]
) -> Any:
    """Drive ``plan`` on an async cursor (tuple rows); returns what it
    returns. An exception leaves the connection settled (:func:`_settle`).
    """
    try:
        return await _run_steps_async(cursor, plan, queries)
    except BaseException:
        await _settle_async(cursor)
        raise


def _pipelines(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether a step may send its statement in pipeline mode on ``cursor``:
    libpq has it, and the cursor is psycopg's own server-side binding one
    (a caller's client-side cursor, Django's, runs the step plainly).
    """
    return psycopg.Pipeline.is_supported() and not isinstance(cursor, _TEXT_ONLY)


async def _run_steps_async(
    cursor: psycopg.AsyncCursor[Any], plan: Plan, queries: dict[str, str]
) -> Any:
    reply: list[Any] | None = None
    while True:
        try:
            step = plan.send(reply) if reply is not None else next(plan)
        except StopIteration as stop:
            return stop.value
        if isinstance(step, Copy):
            async with cursor.copy(queries[step.query]) as copy:
                for row in step.rows:
                    await copy.write_row(row)
            reply = []
            continue
        if isinstance(step, CopyText):
            async with cursor.copy(queries[step.query]) as copy:
                for chunk in step.chunks:
                    await copy.write(chunk)
                _send_buffered(cursor)
                step.meanwhile()
            reply = []
            continue
        binary = _binary(cursor, step.binary)
        if step.meanwhile is not None and _pipelines(cursor):
            async with cursor.connection.pipeline():
                await cursor.execute(queries[step.query], step.params, binary=binary)
                cursor.connection.pgconn.flush()
                step.meanwhile()
                rows = await cursor.fetchall()
                names = _names(cursor)
        else:
            await cursor.execute(queries[step.query], step.params, binary=binary)
            if step.meanwhile is not None:
                step.meanwhile()
            names = _names(cursor)
            rows = await cursor.fetchall() if names is not None else []
        if names is None or step.tuples:
            reply = rows
        else:
            reply = [dict(zip(names, r, strict=True)) for r in rows]
