"""PostgreSQL wake-ups for ``wait`` (internal): one LISTEN connection per
process and database, woken by the NOTIFY that the end of an awaited job
sends (migration 0006: the ``awaited`` flag and its trigger).
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import sql

from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.watch import CompletionWatch, watch_for

#: Seconds between looks at whether the watch should stop, while idle.
LISTEN_SLICE = 0.5
CONNECT_TIMEOUT = 5


def done_channel(schema: str) -> str:
    """The channel the trigger notifies on (same rule as its SQL)."""
    if len(schema.encode()) > 48:
        schema = hashlib.md5(schema.encode()).hexdigest()
    return f"jobkeeper_done_{schema}"


class _ListenSource:
    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo

    def run(self, watch: CompletionWatch) -> None:
        with psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        ) as conn:
            row = conn.execute(QUERIES["notify_channel"]).fetchone()
            if row is None or row[0] is None:
                raise psycopg.OperationalError("no current schema (check search_path)")
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(done_channel(row[0]))))
            watch.set_ready(True)
            # Ends that committed while the connection was being made were
            # not heard: every waiter re-reads once now that nothing is missed.
            watch.deliver_all()
            try:
                while not watch.should_stop():
                    # The timeout bounds the whole generator (psycopg 3.2+),
                    # so should_stop() is looked at every LISTEN_SLICE.
                    for notify in conn.notifies(timeout=LISTEN_SLICE):
                        watch.deliver((int(notify.payload),))
            except BaseException:
                watch.set_ready(False)
                raise


class PostgresWaiting:
    """The waiting half of the PostgreSQL backend (mixed into it)."""

    _conninfo: str

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def job_mark_awaited(self, *, job_id: int) -> None:
        self._fetch("job_mark_awaited", {"id": job_id})

    def completion_watch(self) -> CompletionWatch:
        return watch_for(
            f"postgresql:{self._conninfo}", lambda: _ListenSource(self._conninfo), "postgresql"
        )
