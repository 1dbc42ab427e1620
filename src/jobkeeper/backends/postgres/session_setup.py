"""What each new connection of ours is set up with beyond its options
(internal): prepared statements when it reaches the server itself, and a
search path that finds jobkeeper's tables only in the current schema.

jobkeeper keeps its tables in the current schema, the first of the search
path that exists, where ``migrate`` creates them. Its statements name the
tables unqualified, so with ``search_path=tenant,public`` and the tenant not
migrated yet they found public's: a worker of the new tenant ran the other
tenant's jobs, and its enqueues landed there. A session on which the jobs
table resolves to another schema is therefore pinned to the current schema
alone (on a session of the server itself; through a pooler a session setting
would outlive our use of the server connection), and the schemas are kept on
the connection for ``schema_version`` to name.

psycopg reads timestamptz text only when the session's DateStyle is ISO:
with ``ALTER DATABASE ... SET datestyle = 'SQL, DMY'``, ``PGDATESTYLE=German``
or ``-cDateStyle=...`` in the URL's options, every read of a timestamp raised
NotImplementedError (the rescuer and the periodic service failed every
pass). A session whose DateStyle (as the server reported it at startup, what
psycopg itself goes by) is not ISO is set to ISO, keeping its day/month
order. This is a session setting, but one that is safe through a pooler:
PgBouncer tracks DateStyle per client and restores it on whichever server
connection serves the client.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

from jobkeeper.backends.migrate import MisplacedSchemaError, misplaced_schema
from jobkeeper.backends.postgres.prepared import PREPARE_THRESHOLD, direct_session
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.errors import ConfigError

#: The connection attribute holding its :class:`MisplacedTables`, if any.
_MISPLACED = "_jobkeeper_misplaced_tables"
#: The connection attribute set when its search path names no schema that exists.
_NO_SCHEMA = "_jobkeeper_no_current_schema"


class MisplacedTables(NamedTuple):
    """A session whose search path finds jobkeeper's jobs table in ``found``
    rather than in ``current``, the schema jobkeeper keeps its tables in.
    """

    found: str
    current: str

    @classmethod
    def of(cls, found: str | None, current: str | None) -> MisplacedTables | None:
        """From where a session's search path finds ``jobkeeper_jobs``
        (None: nowhere) and its current schema (None: none exists): None
        when the two agree, or there is nothing to misplace.
        """
        if found is None or current is None or found == current:
            return None
        return cls(found, current)

    def error(self, migrate_hint: str) -> MisplacedSchemaError:
        """The error that says so (see :func:`misplaced_schema`)."""
        return misplaced_schema(self.current, self.found, migrate_hint)


class _Setup(NamedTuple):
    """What ``connection_setup`` read, decided: whether the session is the
    server's own, and the search path to pin it to (None: none).
    """

    reaches: bool
    misplaced: MisplacedTables | None
    pin_to: str | None


def _decide(conn_pid: int, row: Any) -> _Setup:
    server_pid, found, current, quoted = row if row else (None, None, None, None)
    misplaced = MisplacedTables.of(found, current)
    return _Setup(
        direct_session(conn_pid, server_pid), misplaced, None if misplaced is None else quoted
    )


def set_up(conn: psycopg.Connection[Any]) -> None:
    """Set up ``conn``, a new connection of ours (one round trip; one more
    when it is pinned, and one more when its DateStyle is not ISO).
    """
    if not iso_datestyle(conn):
        conn.execute(QUERIES["connection_iso_datestyle"], prepare=False)
    row = conn.execute(QUERIES["connection_setup"], prepare=False).fetchone()
    setup = _decide(conn.info.backend_pid, row)
    setattr(conn, _NO_SCHEMA, row is not None and row[2] is None)
    if setup.reaches:
        conn.prepare_threshold = PREPARE_THRESHOLD
        if setup.pin_to is not None:
            conn.execute(QUERIES["connection_pin_schema"], (setup.pin_to,), prepare=False)
    setattr(conn, _MISPLACED, setup.misplaced)


async def set_up_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`set_up` for an async connection."""
    if not iso_datestyle(conn):
        await conn.execute(QUERIES["connection_iso_datestyle"], prepare=False)
    cursor = await conn.execute(QUERIES["connection_setup"], prepare=False)
    row = await cursor.fetchone()
    setup = _decide(conn.info.backend_pid, row)
    setattr(conn, _NO_SCHEMA, row is not None and row[2] is None)
    if setup.reaches:
        conn.prepare_threshold = PREPARE_THRESHOLD
        if setup.pin_to is not None:
            await conn.execute(QUERIES["connection_pin_schema"], (setup.pin_to,), prepare=False)
    setattr(conn, _MISPLACED, setup.misplaced)


def iso_datestyle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn``'s session reports an ISO DateStyle, the only one
    in which psycopg parses timestamptz text; no round trip (the server
    reports DateStyle at startup and whenever it changes). A session that
    reports none is taken as ISO, as psycopg takes it.
    """
    reported = conn.info.parameter_status("DateStyle")
    return reported is None or reported.startswith("ISO")


def require_iso_datestyle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Refuse a caller's connection (``connection=``) whose DateStyle is not
    ISO, before anything is written on it: the insert reads back the rows it
    writes, whose timestamps psycopg parses in no other DateStyle (a bare
    NotImplementedError out of the insert, before). The session is the
    caller's, so it is not changed here.

    Raises:
        ConfigError: the connection's DateStyle is not ISO.
    """
    if not iso_datestyle(conn):
        reported = conn.info.parameter_status("DateStyle")
        raise ConfigError(
            f"connection= has DateStyle {reported!r}, and psycopg reads timestamps only in "
            "ISO: set DateStyle to ISO on that connection (SET DateStyle = 'ISO'; the "
            "day/month order stays) or in its URL (options=-cDateStyle%3DISO)"
        )


def misplaced_tables(conn: Any) -> MisplacedTables | None:
    """What :func:`set_up` found on ``conn``: None when the search path
    finds jobkeeper's tables in the current schema, or none at all.
    """
    found: MisplacedTables | None = getattr(conn, _MISPLACED, None)
    return found


def no_current_schema(conn: Any) -> bool:
    """Whether :func:`set_up` found that ``conn``'s search path names no
    schema that exists (None, a caller's connection: not known, False).
    """
    return bool(getattr(conn, _NO_SCHEMA, False))
