"""Periodic jobs on PostgreSQL: the stored definitions, each tick inserted once
across the fleet, skips and touches (internal; mixed into ``PostgresBackend``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from jobkeeper.backends.postgres.connections import PostgresConnections
from jobkeeper.backends.postgres.flow import PostgresFlow
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.backends.rows import aware_utc
from jobkeeper.errors import QueueFull
from jobkeeper.periodic import Periodic, PeriodicRow, PeriodicTouch, periodic_from_row


class PostgresPeriodics(PostgresConnections, PostgresFlow):
    """Periodic-job operations of the Backend Protocol (mixed into the backend)."""

    def periodic_upsert(self, *, periodics: Sequence[Periodic]) -> None:
        if not periodics:
            return
        self._fetch(
            "periodic_upsert",
            {
                "names": [p.name for p in periodics],
                "schedules": [str(p.schedule) for p in periodics],
                "timezones": [p.schedule.timezone for p in periodics],
                "tasks": [p.task for p in periodics],
                "queues": [p.queue for p in periodics],
                "priorities": [p.priority for p in periodics],
                "max_attempts": [p.max_attempts for p in periodics],
                "args": [p.args_json for p in periodics],
                "catch_ups": [p.catch_up for p in periodics],
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
            "tick": tick,
            "next_tick": next_tick,
            "channel": self.channel(),
        }
        # A tick into a queue at its max_pending is skipped (recorded as
        # given up, so no other worker enqueues it either) and QueueFull
        # raised for the enqueuer to log; the queue's row lock, taken by
        # the check, is held to the commit.
        full: QueueFull | None = None
        with self._cursor(transaction=True) as cursor:
            cursor.execute(QUERIES["periodic_enqueue_tick_queue"], {"name": name})
            found = cursor.fetchone()
            if found is not None:
                full = self._pending_full(cursor, found[0])
            if full is None:
                cursor.execute(QUERIES["periodic_enqueue_tick"], params)
                rows = cursor.fetchall()
                return int(rows[0][0]) if rows else None
            skip = {k: v for k, v in params.items() if k not in ("tick", "channel")} | {
                "through": tick
            }
            cursor.execute(QUERIES["periodic_skip"], skip)
            skipped = bool(cursor.fetchall())
        if skipped:
            raise full
        return None

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
            "through": through,
            "next_tick": next_tick,
        }
        return bool(self._fetch("periodic_skip", params))

    def periodic_touch(self, *, touches: Sequence[PeriodicTouch]) -> set[str]:
        if not touches:
            return set()
        params = {
            "names": [t.name for t in touches],
            "schedules": [t.schedule for t in touches],
            "timezones": [t.timezone for t in touches],
            "next_ticks": [t.next_tick_at for t in touches],
        }
        return {row["name"] for row in self._fetch("periodic_touch", params)}

    def periodic_list(self, *, stale_after: float) -> list[PeriodicRow]:
        rows = self._fetch("periodic_list", {"stale_after": stale_after})
        return [periodic_from_row(row, aware_utc) for row in rows]

    def periodic_prune(self, *, stale_after: float) -> list[str]:
        rows = self._fetch("periodic_prune", {"stale_after": stale_after})
        return sorted(row["name"] for row in rows)
