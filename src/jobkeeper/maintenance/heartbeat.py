"""The worker heartbeat: proof of life for every job the worker holds.

It runs on its own thread and its own connection, so neither a busy task
pool nor a blocked event loop can delay it (pgqueuer#430, graphile-worker#497).
Each beat also picks up cancel requests for this worker's running jobs.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from jobkeeper.backends.base import Backend
from jobkeeper.errors import DatabaseError, DatabaseReplaced
from jobkeeper.maintenance.service import IntervalService
from jobkeeper.models import Claim, Job, WorkerInfo

logger = logging.getLogger("jobkeeper.worker")


class Heartbeat(IntervalService):
    """Refreshes ``jobkeeper_workers.heartbeat_at`` every ``interval`` seconds.

    Args:
        backend: a dedicated backend.
        worker: this worker's identity.
        interval: seconds between beats (``heartbeat_interval``).
        on_cancel: called with each claim whose job was asked to cancel.
        stale_after: a beat acknowledged more than this many seconds after the
            previous one ends a stale spell (counted, see :meth:`liveness`).
        on_holds: called after a spell (on the beat that ends it and on the
            next) with the jobs the database says we hold, read after the
            beat, and the spell count as of that beat.
        on_replaced: called (on this thread, at every beat that finds it)
            when the database file was removed or replaced under the worker
            (SQLite): the worker stops on it, its beats having nowhere to go.
    """

    def __init__(
        self,
        backend: Backend,
        worker: WorkerInfo,
        interval: float,
        on_cancel: Callable[[Claim], None],
        stale_after: float | None = None,
        on_holds: Callable[[list[Job], int], None] | None = None,
        on_replaced: Callable[[DatabaseReplaced], None] | None = None,
    ) -> None:
        super().__init__("jobkeeper-heartbeat", interval)
        self._backend = backend
        self._worker = worker
        self._on_cancel = on_cancel
        self._on_holds = on_holds
        self._on_replaced = on_replaced
        #: Test hook: when set, beats are skipped (simulates a stalled worker).
        self.paused = False
        # Writers of the last acknowledged beat and the stale spells.
        self._lock = threading.Lock()
        # (last beat, stale spells). Spells are stretches without an
        # acknowledged beat for over ``stale_after`` seconds (a paused
        # process, a database outage), counted when they end: the worker's
        # claims may have been rescued during one. Each write replaces the
        # pair whole (the count before the beat that ends a spell), so
        # liveness(), twice for every job started, reads it without the lock
        # and never sees a fresh beat with the count from before the spell.
        self._liveness = (time.monotonic(), 0)
        self._stale_after = stale_after
        #: When a beat last failed or waited over ``interval`` to be
        #: acknowledged (``time.monotonic()``), and since when the beat now
        #: being written has been waiting (None: none is).
        self.trouble_at = -math.inf
        self._writing_since: float | None = None
        #: Set by the beat that ends a stale spell: the next beat reads our
        #: holds again (see run_once).
        self._recheck_holds = False

    @property
    def _last_beat(self) -> float:
        return self._liveness[0]

    @_last_beat.setter
    def _last_beat(self, value: float) -> None:
        self._liveness = (value, self._liveness[1])

    @property
    def _stale_spells(self) -> int:
        return self._liveness[1]

    @_stale_spells.setter
    def _stale_spells(self, value: int) -> None:
        self._liveness = (self._liveness[0], value)

    def note_beat(self) -> None:
        """Record a heartbeat written elsewhere (the worker's registration)."""
        with self._lock:
            self._last_beat = time.monotonic()

    def beat_age(self) -> float:
        """Seconds since the last heartbeat the database acknowledged."""
        return time.monotonic() - self._last_beat

    def liveness(self) -> tuple[float, int]:
        """``(beat_age(), stale spells so far)``, read together: a spell is
        counted by the same beat that ends it, so a fresh age is never seen
        with the count from before the spell that preceded it.
        """
        last_beat, spells = self._liveness
        return time.monotonic() - last_beat, spells

    def troubled_within(self, seconds: float) -> bool:
        """Whether, within the last ``seconds``, a beat failed or waited over
        ``interval`` for the database (or one is waiting that long now), or
        beats stopped altogether (this process was paused, or starved): the
        database was down or locked for every worker alike, or this process
        held up the others itself (a SQLite write lock held through a pause).
        """
        now = time.monotonic()
        writing_since = self._writing_since
        if writing_since is not None and now - writing_since > self.interval:
            return True
        if now - self._last_beat > 2 * self.interval and not self.paused:
            return True
        return now - self.trouble_at < seconds

    def run_once(self) -> None:
        if self.paused:
            return
        sent = time.monotonic()
        self._writing_since = sent
        try:
            self._backend.worker_heartbeat(worker=self._worker)
        except DatabaseReplaced as exc:
            self.trouble_at = time.monotonic()
            if self._on_replaced is None:
                raise
            self._on_replaced(exc)
            return
        except DatabaseError:
            self.trouble_at = time.monotonic()
            raise
        finally:
            self._writing_since = None
        if time.monotonic() - sent > self.interval:
            self.trouble_at = time.monotonic()
        with self._lock:
            gap = sent - self._last_beat
            spell_ended = self._stale_after is not None and gap > self._stale_after
            if spell_ended:
                self._stale_spells += 1
            self._last_beat = sent
        if gap > 2 * self.interval:
            # No beat for a while (a pause, a starved process): others' beats
            # may have waited on us meanwhile, so judge nobody for a window.
            self.trouble_at = time.monotonic()
        if self._on_holds is not None and (spell_ended or self._recheck_holds):
            # Our claims may have been rescued while we were silent: the
            # worker stops what no longer holds its claim. Read twice, the
            # second time a beat later: a rescue that judged us silent may
            # still be committing at the first read, which does not wait for
            # its row locks (this thread must never wait on a paused rescuer).
            self._recheck_holds = spell_ended
            spells = self._stale_spells
            self._on_holds(self._backend.job_held_by(worker_id=self._worker.id), spells)
        for claim in self._backend.job_cancel_requested(worker_id=self._worker.id):
            self._on_cancel(claim)
