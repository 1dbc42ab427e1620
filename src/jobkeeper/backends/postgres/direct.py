"""Statements sent through libpq itself (internal), for the single enqueue:
one call per web request, where psycopg's cursor layers (query conversion,
parameter dumping, result and row objects) were about a third of the
client's time (CPU per call on a held connection: 79 us through a cursor,
44 us this way).

A statement here is written with ``$n`` placeholders, takes its parameters
as text (bytes, or None for NULL) and returns its rows in binary, decoded by
column type. On a connection that reaches PostgreSQL itself (see
:func:`~jobkeeper.backends.postgres.prepared.direct_session`) it is
prepared once, under its own name, the first time the connection runs it;
behind a pooler it is sent with its text every time (an unnamed statement,
as psycopg does there). It runs only on a connection of ours that is idle
outside a transaction; psycopg's own wait drives the I/O, so Ctrl-C still
cancels it on the server. The generator and wait are the ones psycopg's
cursors use (``psycopg.generators.execute``, ``Connection.wait``), not
documented API: ``tests/backends/test_direct.py`` is what tells when a
psycopg release changes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import errors, pq
from psycopg.generators import execute

#: PostgreSQL's binary timestamps count microseconds from this instant.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_INT8_OID = 20
_TIMESTAMPTZ_OID = 1184


def _int8(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _timestamptz(data: bytes) -> datetime:
    # now() is never infinite, the only value this cannot express.
    return _PG_EPOCH + timedelta(microseconds=int.from_bytes(data, "big", signed=True))


#: Binary decoders by column type; a column of another type reads as None.
_DECODERS: dict[int, Callable[[bytes], Any]] = {
    _INT8_OID: _int8,
    _TIMESTAMPTZ_OID: _timestamptz,
}
_Connection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
#: SQLSTATE invalid_sql_statement_name: no prepared statement of that name.
_UNDEFINED_PREPARED = b"26000"
#: Runs of a statement whose prepared name the session lost: the first, and
#: one after preparing it again (a second loss is raised, not chased).
_ATTEMPTS = 2


@dataclasses.dataclass(frozen=True, slots=True)
class DirectStatement:
    """A statement for :func:`run_direct`: its ``$n`` SQL, and the name it
    is prepared under (one per statement and jobkeeper version, so a newer
    text never meets an older plan on the same session).
    """

    name: bytes
    sql: bytes


@functools.cache
def direct_statement(query: str, sql: str) -> DirectStatement:
    """The :class:`DirectStatement` of ``queries.sql``'s ``query``, whose text
    is ``sql``; prepared as ``jobkeeper_<query>_<hash of sql>``.
    """
    digest = hashlib.blake2b(sql.encode(), digest_size=6).hexdigest()
    return DirectStatement(f"jobkeeper_{query}_{digest}".encode(), sql.encode())


def _prepared_on(conn: _Connection) -> set[bytes]:
    names: set[bytes] | None = getattr(conn, "_jobkeeper_direct_prepared", None)
    if names is None:
        names = set()
        conn._jobkeeper_direct_prepared = names  # type: ignore[union-attr]
    return names


def _rows(results: list[pq.abc.PGresult], conn: _Connection) -> list[tuple[Any, ...]]:
    """The rows of the statement's one result; raises psycopg's error for a
    refused one, as a cursor would (so the backend translates it the same).
    """
    result = results[-1]
    if result.status not in _OK:
        raise errors.error_from_result(result, encoding=conn.info.encoding)
    decoders = [_DECODERS.get(result.ftype(i)) for i in range(result.nfields)]
    rows = []
    for row in range(result.ntuples):
        values = []
        for column, decode in enumerate(decoders):
            data = result.get_value(row, column)
            values.append(None if decode is None or data is None else decode(data))
        rows.append(tuple(values))
    return rows


def _prepare_done(results: list[pq.abc.PGresult], conn: _Connection) -> None:
    """Check a prepare's result. A name already taken is this statement: a
    prepare whose answer a cancel (Ctrl-C, a cancelled task) cut short.
    """
    with contextlib.suppress(errors.DuplicatePreparedStatement):
        _rows(results, conn)


def _send(
    conn: _Connection,
    statement: DirectStatement,
    params: Sequence[bytes | None],
) -> bool:
    """Send the statement; returns whether it must be prepared first (sent:
    the prepare, to wait for before calling this again).
    """
    pgconn = conn.pgconn
    if conn.prepare_threshold is None:
        pgconn.send_query_params(statement.sql, params, result_format=pq.Format.BINARY)
        return False
    prepared = _prepared_on(conn)
    if statement.name not in prepared:
        pgconn.send_prepare(statement.name, statement.sql)
        return True
    pgconn.send_query_prepared(statement.name, params, result_format=pq.Format.BINARY)
    return False


def _check_idle(conn: _Connection) -> None:
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(
            "internal error: a direct statement needs an idle connection outside a transaction"
        )


def _deallocated(
    results: list[pq.abc.PGresult], conn: _Connection, statement: DirectStatement
) -> bool:
    """Whether the server refused the statement because its session no
    longer has it prepared; it is then forgotten, to be prepared again, and
    nothing of it ran. psycopg sends ``DEALLOCATE ALL`` after rolling back
    a transaction in which it had prepared statements of its own (a refused
    ``max_pending`` or serial-key enqueue, a cancelled one), and after a
    ``DISCARD ALL`` or a schema change it ran.
    """
    result = results[-1]
    if result.status != pq.ExecStatus.FATAL_ERROR:
        return False
    if result.error_field(pq.DiagnosticField.SQLSTATE) != _UNDEFINED_PREPARED:
        return False
    _prepared_on(conn).discard(statement.name)
    return True


def run_direct(
    conn: psycopg.Connection[Any],
    statement: DirectStatement,
    params: Sequence[bytes | None],
) -> list[tuple[Any, ...]]:
    """Run ``statement`` with ``params`` (text; None is NULL) on ``conn``,
    an idle connection of ours in autocommit; returns its rows, int8 and
    timestamptz columns decoded (aware UTC datetimes), others None.

    Raises:
        psycopg.Error: as a cursor's ``execute`` would.
    """
    with conn.lock:
        _check_idle(conn)
        for _ in range(_ATTEMPTS):
            if _send(conn, statement, params):
                _prepare_done(conn.wait(execute(conn.pgconn)), conn)
                _prepared_on(conn).add(statement.name)
                _send(conn, statement, params)
            results = conn.wait(execute(conn.pgconn))
            if not _deallocated(results, conn, statement):
                break
        return _rows(results, conn)


async def run_direct_async(
    conn: psycopg.AsyncConnection[Any],
    statement: DirectStatement,
    params: Sequence[bytes | None],
) -> list[tuple[Any, ...]]:
    """:func:`run_direct` on an async connection."""
    async with conn.lock:
        _check_idle(conn)
        for _ in range(_ATTEMPTS):
            if _send(conn, statement, params):
                _prepare_done(await conn.wait(execute(conn.pgconn)), conn)
                _prepared_on(conn).add(statement.name)
                _send(conn, statement, params)
            results = await conn.wait(execute(conn.pgconn))
            if not _deallocated(results, conn, statement):
                break
        return _rows(results, conn)
