"""The pruner: deletes completed and cancelled jobs once ``retention`` has passed.

Deletes in batches of 1,000 so a large backlog never holds locks for long.
Dead letters are kept until requeued or deleted by hand.
"""

from __future__ import annotations

from jobkeeper.backends.base import Backend
from jobkeeper.maintenance.service import IntervalService

#: Rows deleted per statement.
BATCH = 1000


class Pruner(IntervalService):
    """Deletes completed and cancelled jobs older than ``retention`` seconds, in batches."""

    def __init__(self, backend: Backend, retention: float, interval: float) -> None:
        super().__init__("jobkeeper-pruner", interval)
        self._backend = backend
        self._retention = retention

    def run_once(self) -> None:
        while self._backend.job_prune_finished(older_than=self._retention, limit=BATCH) == BATCH:
            if self._stop.is_set():
                return
