"""Periodic jobs on SQLite: the stored definitions, each tick inserted once
across processes, skips and touches (internal; mixed into ``SqliteBackend``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from jobkeeper.backends.rows import (
    epoch_to_datetime,
)
from jobkeeper.backends.sqlite import wakeups
from jobkeeper.backends.sqlite.connection import SqliteConnection, _rows
from jobkeeper.backends.sqlite.flow import SqliteFlow
from jobkeeper.backends.sqlite.queries import QUERIES
from jobkeeper.errors import QueueFull
from jobkeeper.periodic import Periodic, PeriodicRow, PeriodicTouch, periodic_from_row


class SqlitePeriodics(SqliteConnection, SqliteFlow):
    """Periodic-job operations of the Backend Protocol (mixed into the backend)."""

    def periodic_upsert(self, *, periodics: Sequence[Periodic]) -> None:
        if not periodics:
            return
        with self._write() as conn:
            for periodic in sorted(periodics, key=lambda p: p.name):
                conn.execute(
                    QUERIES["periodic_upsert"],
                    {
                        "name": periodic.name,
                        "schedule": str(periodic.schedule),
                        "timezone": periodic.schedule.timezone,
                        "task": periodic.task,
                        "queue": periodic.queue,
                        "priority": periodic.priority,
                        "max_attempts": periodic.max_attempts,
                        "args": periodic.args_json,
                        "catch_up": periodic.catch_up,
                    },
                )

    def periodic_enqueue_tick(
        self,
        *,
        name: str,
        schedule: str,
        timezone: str,
        tick: datetime,
        next_tick: datetime | None,
    ) -> int | None:
        params = {
            "name": name,
            "schedule": schedule,
            "timezone": timezone,
            "tick": tick.timestamp(),
            "next_tick": None if next_tick is None else next_tick.timestamp(),
        }
        # One BEGIN IMMEDIATE: the record and the job commit together, and a
        # twin waits for the write lock, then finds the tick recorded. A tick
        # into a queue at its max_pending is given up instead (so no other
        # worker enqueues it) and QueueFull raised for the enqueuer to log.
        full: QueueFull | None = None
        skipped = False
        with self._write() as conn:
            found = conn.execute(QUERIES["periodic_enqueue_tick_queue"], {"name": name}).fetchone()
            if found is not None:
                full = self._pending_full(conn, found[0])
            if full is not None:
                skip = {k: v for k, v in params.items() if k != "tick"}
                skip["through"] = params["tick"]
                skipped = bool(conn.execute(QUERIES["periodic_skip"], skip).fetchall())
                template = []
            else:
                template = _rows(conn.execute(QUERIES["periodic_enqueue_tick"], params))
            inserted = None
            if template:
                row = template[0]
                inserted = conn.execute(
                    QUERIES["periodic_enqueue_tick_insert"],
                    {
                        "queue": row["queue"],
                        "task": row["task"],
                        "args": row["args"],
                        "priority": row["priority"],
                        "max_attempts": row["max_attempts"],
                        "tick": params["tick"],
                    },
                ).fetchone()
        if inserted is None:
            if full is not None and skipped:
                raise full  # after the commit: the tick stays given up
            return None
        wakeups.wake(self.path)
        return int(inserted[0])

    def periodic_skip(
        self,
        *,
        name: str,
        schedule: str,
        timezone: str,
        through: datetime,
        next_tick: datetime | None,
    ) -> bool:
        params = {
            "name": name,
            "schedule": schedule,
            "timezone": timezone,
            "through": through.timestamp(),
            "next_tick": None if next_tick is None else next_tick.timestamp(),
        }
        with self._write() as conn:
            return bool(conn.execute(QUERIES["periodic_skip"], params).fetchall())

    def periodic_touch(self, *, touches: Sequence[PeriodicTouch]) -> set[str]:
        if not touches:
            return set()
        touched: set[str] = set()
        with self._write() as conn:
            for touch in touches:
                params = {
                    "name": touch.name,
                    "schedule": touch.schedule,
                    "timezone": touch.timezone,
                    "next_tick": None
                    if touch.next_tick_at is None
                    else touch.next_tick_at.timestamp(),
                }
                if conn.execute(QUERIES["periodic_touch"], params).fetchall():
                    touched.add(touch.name)
        return touched

    def periodic_list(self, *, stale_after: float) -> list[PeriodicRow]:
        rows = self._fetch("periodic_list", {"stale_after": stale_after})
        return [periodic_from_row(row, epoch_to_datetime) for row in rows]

    def periodic_prune(self, *, stale_after: float) -> list[str]:
        with self._write() as conn:
            rows = conn.execute(QUERIES["periodic_prune"], {"stale_after": stale_after}).fetchall()
        return sorted(row[0] for row in rows)
