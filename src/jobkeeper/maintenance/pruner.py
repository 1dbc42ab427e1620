"""The pruner: deletes completed and cancelled jobs once ``retention`` has passed.

Deletes in batches of 1,000 so a large backlog never holds locks for long.
Dead letters are kept until requeued or deleted by hand.

It also tends the jobs table (``Backend.job_table_maintain``): statistics are
refreshed when missing or stale, or the planner may claim by sorting every
available job; and where the server does not autovacuum, the table is
vacuumed, since every claim and ack leaves a dead row version behind in the
claim index (a drain slowed from 2,700 to 800 jobs/s over 1 M jobs on a server
with ``autovacuum = off``).
"""

from __future__ import annotations

import time

from jobkeeper.backends.base import Backend
from jobkeeper.maintenance.service import IntervalService

#: Rows deleted per statement.
BATCH = 1000
#: Seconds between the pruner's own VACUUMs when the server does not autovacuum.
VACUUM_INTERVAL = 10.0


class Pruner(IntervalService):
    """Deletes completed and cancelled jobs older than ``retention`` seconds, in batches."""

    def __init__(self, backend: Backend, retention: float, interval: float) -> None:
        super().__init__("jobkeeper-pruner", interval)
        self._backend = backend
        self._retention = retention
        self._next_vacuum = 0.0

    def run_once(self) -> None:
        while self._backend.job_prune_finished(older_than=self._retention, limit=BATCH) == BATCH:
            if self._stop.is_set():
                return
        now = time.monotonic()
        vacuum = now >= self._next_vacuum
        if vacuum:
            self._next_vacuum = now + VACUUM_INTERVAL
        self._backend.job_table_maintain(vacuum=vacuum)
