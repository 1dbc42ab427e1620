"""What psycopg_pool's logger (``psycopg.pool``) passes on about jobkeeper's
pools (internal).

A connection jobkeeper closes on purpose -- found cut on checkout (a server
restart, ``idle_session_timeout``, a failover), or closed after an error that
left it unusable -- goes back to its pool closed, so that the pool opens a
replacement. psycopg_pool logs each such return as a WARNING "discarding
closed connection"; under a one-minute ``idle_session_timeout`` an
application logged one per pooled connection after every quiet spell, for a
replacement jobkeeper had already made without failing any call. Those
records are dropped; a connection that closed while a call was using it (the
call fails and says so itself) is still reported by the pool.
"""

from __future__ import annotations

import logging
from typing import Any

_DISCARDED = "discarding closed connection: %s"


def close_on_purpose(conn: Any) -> None:
    """Mark ``conn`` as closed by jobkeeper, then close it (sync connections;
    async ones: :func:`mark_on_purpose` and ``await conn.close()``).
    """
    mark_on_purpose(conn)
    conn.close()


def mark_on_purpose(conn: Any) -> None:
    """Mark ``conn`` so that its return to the pool, closed, is not logged."""
    conn._jobkeeper_closed_on_purpose = True


class ClosedOnPurpose(logging.Filter):
    """Drops psycopg_pool's "discarding closed connection" for connections
    :func:`mark_on_purpose` marked; every other record passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.msg == _DISCARDED
            and isinstance(args, tuple)
            and len(args) == 1
            and getattr(args[0], "_jobkeeper_closed_on_purpose", False)
        )


logging.getLogger("psycopg.pool").addFilter(ClosedOnPurpose())
