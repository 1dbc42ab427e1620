"""Server-side prepared statements on PostgreSQL (internal): made only on
connections that reach the server itself, and given up when a schema change
makes them stale.
"""

from __future__ import annotations

from typing import Any

import psycopg

from jobkeeper.backends.postgres.queries import QUERIES

#: Runs of one statement on one connection after which psycopg prepares it
#: on the server (parsed and planned once; unprepared, planning the insert
#: was about a third of the server's time per enqueue). Only on connections
#: that reach PostgreSQL itself: see :func:`direct_session`.
PREPARE_THRESHOLD = 5
#: PostgreSQL's refusal of a prepared statement whose result columns changed
#: under it (a migration altered a column it returns).
_STALE_PLAN = "cached plan must not change result type"


def direct_session(conn_pid: int, server_pid: Any) -> bool:
    """Whether a connection whose libpq PID is ``conn_pid`` and whose server
    reports ``server_pid`` is a session of PostgreSQL itself.

    Behind a pooler in transaction mode (PgBouncer before 1.21, or without
    ``max_prepared_statements``) one connection's statements reach different
    server sessions, where a prepared name is missing, taken, or names
    another statement, and a session setting outlives our use of it. A
    pooler answers the client's startup with a cancel key of its own, so the
    backend PID libpq was given differs from the one the server reports:
    only a session whose two PIDs agree prepares statements (see
    ``session_setup``).
    """
    return server_pid is not None and conn_pid == server_pid


def reaches_server(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``conn`` is a session of PostgreSQL itself, not a pooler's
    client connection (see :func:`direct_session`). One round trip.
    """
    row = conn.execute(QUERIES["connection_backend_pid"], prepare=False).fetchone()
    return direct_session(conn.info.backend_pid, row[0] if row else None)


def stale_plan(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL refusing a prepared statement whose
    result type a schema change altered: the connection's prepared
    statements are stale, and the connection is given up (the next one
    prepares afresh). The statement itself did nothing.
    """
    return isinstance(exc, psycopg.errors.FeatureNotSupported) and _STALE_PLAN in str(exc)
