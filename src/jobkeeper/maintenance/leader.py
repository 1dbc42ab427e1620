"""Leader election: one worker of the fleet runs the once-per-fleet services.

A lease row in ``jobkeeper_leader`` (the same on every backend): a worker
holds the lease while it keeps extending it within ``ttl`` seconds of the
database clock; when the holder stops extending (it died, paused, lost the
database), the lease expires and the next worker to ask takes it. River's
``internal/leadership`` elects the same way.

Leadership only decides *who works*. Services that depend on it (the pruner)
must stay correct with two leaders, because no lease can rule that out: a
leader paused past its lease still believes in it for a moment after it
wakes. Here that moment is bounded: :attr:`Leader.is_leader` trusts the
lease only until ``ttl`` seconds after the request that extended it was
*sent* (a monotonic clock, which counts a SIGSTOP), never after.

The rescuer does not depend on the leader: every worker rescues. A rescue
must come within ``rescue_after`` of a holder's death whatever else is
wrong, and a leader that is itself paused would hold every rescue up for
its lease; each rescue write is fenced and re-checks the holder's silence,
so concurrent rescuers are safe. Nor do periodic jobs: the database decides
which tick is inserted (DESIGN.md, "Periodic jobs").
"""

from __future__ import annotations

import logging
import time

from jobkeeper.backends.base import Backend
from jobkeeper.errors import DatabaseError
from jobkeeper.maintenance.service import IntervalService

logger = logging.getLogger("jobkeeper.maintenance")

#: The lease of the maintenance services (the pruner).
MAINTENANCE = "maintenance"


class Leader(IntervalService):
    """Keeps trying to hold (or extend) the lease ``name``.

    Args:
        backend: a dedicated backend.
        worker_id: this worker.
        ttl: seconds a lease lasts without being extended (database clock).
        name: which lease.
    """

    def __init__(
        self, backend: Backend, worker_id: str, ttl: float, name: str = MAINTENANCE
    ) -> None:
        super().__init__("jobkeeper-leader", ttl / 3)
        self._backend = backend
        self._worker_id = worker_id
        self._ttl = ttl
        self._lease_name = name
        self._valid_until = -1.0

    @property
    def is_leader(self) -> bool:
        """Whether this worker holds the lease now, by its own clock's
        conservative reckoning (see the module docstring).
        """
        return time.monotonic() < self._valid_until

    def run_once(self) -> None:
        sent = time.monotonic()
        was_leader = self.is_leader
        try:
            held = self._backend.leader_try_acquire(
                name=self._lease_name, worker_id=self._worker_id, ttl=self._ttl
            )
        except DatabaseError:
            # Keep what we had until it runs out: an unreachable database
            # cannot have handed the lease to anyone meanwhile... but it may
            # once it is back, by which time our own reckoning has expired.
            raise
        self._valid_until = sent + self._ttl if held else -1.0
        if held and not was_leader:
            logger.info("worker %s is now the %s leader", self._worker_id, self._lease_name)
        elif was_leader and not held:
            logger.info("worker %s lost the %s lease", self._worker_id, self._lease_name)

    def stop(self, timeout: float = 5.0, *, resign: bool = True) -> None:
        """Stop trying and give the lease up (unless not ``resign``), so
        another worker need not wait it out.
        """
        super().stop(timeout)
        held, self._valid_until = self._valid_until > 0, -1.0
        if held and resign:
            try:
                self._backend.leader_resign(name=self._lease_name, worker_id=self._worker_id)
            except DatabaseError as exc:
                logger.warning("could not resign the %s lease (%s)", self._lease_name, exc)
