"""The pruner: deletes completed and cancelled jobs once ``retention`` has passed.

Deletes in batches of 1,000 so a large backlog never holds locks for long.
Dead letters are kept until requeued or deleted by hand, unless
``dead_retention`` is set: then those older than it go the same way.

It also tends the jobs table (``Backend.job_table_maintain``): statistics are
refreshed when missing or stale, or the planner may claim by sorting every
available job; and where the server does not autovacuum, the table is
vacuumed, since every claim and ack leaves a dead row version behind in the
claim index (a drain slowed from 2,700 to 800 jobs/s over 1 M jobs on a server
with ``autovacuum = off``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jobkeeper.backends.base import Backend
from jobkeeper.maintenance.service import IntervalService

#: Rows deleted per statement.
BATCH = 1000
#: Seconds between the pruner's own VACUUMs when the server does not autovacuum.
VACUUM_INTERVAL = 10.0


class Pruner(IntervalService):
    """Deletes completed and cancelled jobs older than ``retention`` seconds (and dead
    letters older than ``dead_retention``), in batches.

    Args:
        backend: a dedicated backend.
        retention: seconds finished jobs are kept.
        dead_retention: seconds dead letters are kept (None: forever).
        interval: seconds between passes.
        only_when: passes run only while it says True (the worker passes its
            leader's ``is_leader``: one pruner per fleet is enough, and two
            at once would only contend for the same rows).
    """

    def __init__(
        self,
        backend: Backend,
        retention: float,
        interval: float,
        only_when: Callable[[], bool] | None = None,
        dead_retention: float | None = None,
    ) -> None:
        super().__init__("jobkeeper-pruner", interval, only_when)
        self._backend = backend
        self._retention = retention
        self._dead_retention = dead_retention
        self._next_vacuum = 0.0

    def run_once(self) -> None:
        while self._backend.job_prune_finished(older_than=self._retention, limit=BATCH) == BATCH:
            if self._stop.is_set():
                return
        if self._dead_retention is not None:
            older_than = self._dead_retention
            while self._backend.dead_letter_prune(older_than=older_than, limit=BATCH) == BATCH:
                if self._stop.is_set():
                    return
        now = time.monotonic()
        vacuum = now >= self._next_vacuum
        if vacuum:
            self._next_vacuum = now + VACUUM_INTERVAL
        self._backend.job_table_maintain(vacuum=vacuum)
