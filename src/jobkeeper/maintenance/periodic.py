"""The periodic enqueuer: every worker whose app registers periodic jobs
enqueues their ticks; the database decides which insert wins.

No leader is involved in correctness (Oban's stale leadership inserted cron
jobs twice, oban-bg/oban#1488): each tick is enqueued by one atomic
operation that advances the tick record in ``jobkeeper_periodic`` and
inserts the job together (``Backend.periodic_enqueue_tick``), conditional on
the tick being newer than the record. However many workers try the same
tick, one insert happens; a crash between "recorded" and "inserted" cannot
happen (procrastinate-org/procrastinate#1495). River's periodic job enqueuer
(``riverqueue/river:internal/maintenance/periodic_job_enqueuer.go``) runs on
the leader and relies on unique keys instead; graphile-worker's
``_private_known_crontabs`` (``graphile/worker:src/cron.ts``) records each
crontab's last execution in the statement that adds the job, which is the
model here.

A pass (at each tick of the worker's periodics, and at least every
``refresh`` seconds to notice others' changes):

1. At the first pass only: store the code's definitions (``periodic_upsert``;
   code is the source of truth: a changed schedule replaces the stored one).
2. Read the rows. For each of this worker's periodics whose stored
   definition (schedule and time zone) is still this worker's, settle the
   ticks due since the last one recorded, oldest first:

   * a tick at or before ``seen_at`` came due while some worker
     registering it was alive (``seen_at`` is refreshed by every such
     worker's every pass), and so did one at or before ``seen_at + slack``
     while the row is still being refreshed (``seen_at`` at most twice the
     slack ago); a tick at or after this worker's own start came due while
     this worker ran: all are enqueued, however late;
   * any other tick was *missed* (no worker ran): enqueued when it is at
     most ``catch_up`` seconds old, else skipped, with one WARNING naming
     the periodic and how many ticks were skipped. Skipped only once this
     worker has reached the database for ``JUDGE_AFTER`` seconds, since it
     started or since its last failed pass: after a database outage every
     live worker's ``seen_at`` is as old as the outage, and one that ran
     through it (cut off, not gone) settles those ticks itself, as due
     while it ran, once it reaches the database again. Until then this
     worker settles the periodic no further (its ticks wait, in order).

3. Refresh ``seen_at`` where the stored definition is this worker's
   (``periodic_touch``), after the ticks are settled: a pass that dies
   half-way leaves the evidence of the gap for the next worker.

A periodic whose stored definition is another (a newer deploy replaced it)
is left alone: this worker fires nothing for it and says so once. Rolling
deploys: the first new-code worker to start replaces the definition; from
then on the old schedule never fires, even from old-code workers still
running (every write matches on the schedule); the new one fires on every
new-code worker. Restarting an old-code worker during the rollout (or a
rollback) puts the old definition back: the last worker to start wins.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from jobkeeper.backends.base import Backend
from jobkeeper.errors import ConfigError, DatabaseError, QueueFull
from jobkeeper.maintenance.service import IntervalService
from jobkeeper.periodic import Periodic, PeriodicRow, PeriodicTouch

logger = logging.getLogger("jobkeeper.periodic")

#: Longest wait between passes, in seconds: how soon a worker notices that a
#: definition was replaced or its row pruned, and how often ``seen_at`` moves.
MAX_REFRESH = 5.0
#: Seconds after a row's ``seen_at`` during which a tick still counts as due
#: while a worker was alive: two of the longest refresh periods (a live
#: worker refreshes at least that often).
ALIVE_SLACK = 2 * MAX_REFRESH
#: Most ticks one periodic enqueues in one pass; the rest stay owed (they
#: are recorded nowhere yet) and are enqueued by the next passes.
MAX_TICKS_PER_PASS = 1_000
#: Skipped ticks are counted up to this many for the log.
MAX_COUNTED = 100_000
#: Seconds a worker must have reached the database (since its start, or
#: its last failed pass) before it judges ticks missed: every live worker
#: refreshes within two refresh periods of the database's return.
JUDGE_AFTER = 2 * ALIVE_SLACK
#: Shortest wait between passes, seconds (a tick an instant away).
MIN_WAIT = 0.005
_MICROSECOND = timedelta(microseconds=1)


class PeriodicEnqueuer(IntervalService):
    """Enqueues the ticks of a worker's periodic jobs (see the module docstring).

    Args:
        backend: a dedicated backend.
        periodics: this worker's definitions (``jq.periodics.values()``).
        refresh: longest wait between passes, seconds (at most
            ``MAX_REFRESH``; the worker passes its heartbeat interval).
        stale_after: seconds, for the rows' ``stale`` flag (not used to decide).
        alive_slack: seconds after ``seen_at`` during which a tick counts as
            due while a worker was alive (default ``ALIVE_SLACK``).
        judge_after: seconds of reaching the database before ticks are
            judged missed (default ``JUDGE_AFTER``; see the module docstring).
    """

    def __init__(
        self,
        backend: Backend,
        periodics: Sequence[Periodic],
        *,
        refresh: float = MAX_REFRESH,
        stale_after: float = 60.0,
        alive_slack: float = ALIVE_SLACK,
        judge_after: float = JUDGE_AFTER,
    ) -> None:
        self._refresh = min(max(refresh, MIN_WAIT), MAX_REFRESH)
        super().__init__("jobkeeper-periodic", self._refresh)
        self._backend = backend
        self._periodics = {p.name: p for p in periodics}
        self._stale_after = stale_after
        self._slack = timedelta(seconds=alive_slack)
        self._judge_after = judge_after
        # time.monotonic() of the first pass that reached the database since
        # the start or a failed pass (None: none yet).
        self._reached_at: float | None = None
        #: The database clock at this worker's first pass: ticks from then on
        #: came due while it ran. None until the definitions are stored.
        self.started_at: datetime | None = None
        #: Jobs enqueued and ticks skipped by this service (for tests and logs).
        self.enqueued = 0
        self.skipped = 0
        self._replaced: set[str] = set()

    @property
    def periodics(self) -> list[Periodic]:
        """This worker's definitions, by name."""
        return [self._periodics[name] for name in sorted(self._periodics)]

    def run_once(self, now: datetime | None = None) -> None:
        """One pass; ``now`` (aware) pins the clock for tests, else the database's.

        Raises:
            DatabaseError: the pass is retried by the service loop.
        """
        # A failed pass retries within the refresh period, never in a tight loop.
        self.interval = self._refresh
        if not self._periodics:
            return
        try:
            self._pass(now)
        except DatabaseError:
            self._reached_at = None
            raise

    def _pass(self, now: datetime | None) -> None:
        if self.started_at is None:
            start = now if now is not None else self._backend.db_now()
            self._register(self.periodics)
            self.started_at = start
        now = now if now is not None else self._backend.db_now()
        if self._reached_at is None:
            self._reached_at = time.monotonic()
        rows = {row.name: row for row in self._backend.periodic_list(stale_after=self._stale_after)}
        missing = [p for p in self.periodics if p.name not in rows]
        if missing:
            # Pruned (or deleted by hand) while we run: we do register it.
            logger.info(
                "periodic %s: stored again (its row was gone)", ", ".join(p.name for p in missing)
            )
            self._backend.periodic_upsert(periodics=missing)
        touches: list[PeriodicTouch] = []
        deferred = False  # a periodic left unsettled until missed ticks may be judged
        for periodic in self.periodics:
            row = rows.get(periodic.name)
            if row is not None and not self._is_mine(periodic, row):
                continue
            if row is not None and not self._settle(periodic, row, now):
                deferred = True  # and its seen_at keeps the evidence of the gap
                continue
            touches.append(
                PeriodicTouch(
                    periodic.name,
                    str(periodic.schedule),
                    periodic.schedule.timezone,
                    _next_after(periodic, now),
                )
            )
        self._backend.periodic_touch(touches=touches)
        upcoming = [t.next_tick_at for t in touches if t.next_tick_at is not None]
        if upcoming:
            wait = (min(upcoming) - now).total_seconds() + 0.001
            self.interval = min(self._refresh, max(wait, MIN_WAIT))
        if deferred:
            self.interval = min(self.interval, max(self._judging_in(), MIN_WAIT))

    def _judging_in(self) -> float:
        """Seconds until missed ticks may be judged (0 or less: now)."""
        assert self._reached_at is not None
        return self._judge_after - (time.monotonic() - self._reached_at)

    def _register(self, periodics: Sequence[Periodic]) -> None:
        """Store the code's definitions, saying which ones replaced another."""
        before = {row.name: row for row in self._backend.periodic_list(stale_after=1e9)}
        self._backend.periodic_upsert(periodics=periodics)
        for periodic in periodics:
            old = before.get(periodic.name)
            if old is not None and not _same_schedule(periodic, old):
                logger.warning(
                    "periodic %r: schedule %r (%s) replaces %r (%s); the old one no longer fires",
                    periodic.name,
                    str(periodic.schedule),
                    periodic.schedule.timezone,
                    old.schedule,
                    old.timezone,
                )

    def _is_mine(self, periodic: Periodic, row: PeriodicRow) -> bool:
        if _same_schedule(periodic, row):
            self._replaced.discard(periodic.name)
            return True
        if periodic.name not in self._replaced:
            self._replaced.add(periodic.name)
            logger.warning(
                "periodic %r: the stored schedule is %r (%s), registered by a worker started"
                " later; this worker's %r (%s) does not fire (restart it with the new code)",
                periodic.name,
                row.schedule,
                row.timezone,
                str(periodic.schedule),
                periodic.schedule.timezone,
            )
        return False

    def _settle(self, periodic: Periodic, row: PeriodicRow, now: datetime) -> bool:
        """Enqueue or skip every tick of ``periodic`` due by ``now``, oldest
        first. Returns False when it stopped at a missed tick it may not
        judge yet (see ``judge_after``).
        """
        assert self.started_at is not None
        after = row.since_at if row.last_tick_at is None else max(row.since_at, row.last_tick_at)
        # A tick just after the last refresh may have come due before the
        # refreshing worker stopped, or after: only a fleet still passing
        # (a refresh within twice the slack) gives it the benefit of the
        # doubt. One that returns later finds those ticks missed, and
        # catch_up rules them, as it does every other tick of the gap.
        alive_until = row.seen_at
        if now - row.seen_at <= 2 * self._slack:
            alive_until += self._slack
        # Missed ticks before this are older than catch_up, or came before
        # this worker started (after it, none is missed): skipped.
        skip_before = min(self.started_at, now - timedelta(seconds=periodic.catch_up))
        schedule, key = periodic.schedule, (periodic.name, str(periodic.schedule))
        enqueued = 0
        while enqueued < MAX_TICKS_PER_PASS:
            tick = _next_after(periodic, after)
            if tick is None or tick > now:
                return True
            if alive_until < tick < skip_before:
                if self._judging_in() > 0:
                    # A worker cut off by the same outage may be alive, and
                    # settles these itself once it is back: judge them later.
                    return False
                through = skip_before - _MICROSECOND
                if self._backend.periodic_skip(
                    name=key[0],
                    schedule=key[1],
                    timezone=schedule.timezone,
                    through=through,
                    next_tick=_next_after(periodic, now),
                ):
                    count, last = _count(periodic, tick, through)
                    self.skipped += count
                    logger.warning(
                        "periodic %r: skipped %s missed tick%s, %s to %s: no worker"
                        " passed over them then (none ran, or every one was paused or cut"
                        " off), and they are older than catch_up=%gs",
                        periodic.name,
                        f"{count}+" if count >= MAX_COUNTED else count,
                        "" if count == 1 else "s",
                        tick.isoformat(),
                        last.isoformat(),
                        periodic.catch_up,
                    )
                after = through
                continue
            try:
                job_id = self._backend.periodic_enqueue_tick(
                    name=key[0],
                    schedule=key[1],
                    timezone=schedule.timezone,
                    tick=tick,
                    next_tick=_next_after(periodic, tick),
                )
            except QueueFull as full:
                # The tick was given up for everyone (backpressure wins over
                # the schedule); the next tick tries again.
                logger.warning("periodic %r: tick %s skipped: %s", key[0], tick, full)
                after = tick
                continue
            if job_id is not None:
                enqueued += 1
                self.enqueued += 1
                logger.debug("periodic %r: tick %s enqueued as job %d", key[0], tick, job_id)
            after = tick
        return True


def _same_schedule(periodic: Periodic, row: PeriodicRow) -> bool:
    return (row.schedule, row.timezone) == (str(periodic.schedule), periodic.schedule.timezone)


def _next_after(periodic: Periodic, when: datetime) -> datetime | None:
    """The next tick, or None past year 9999."""
    try:
        return periodic.schedule.next_after(when)
    except ConfigError:
        return None


def _count(periodic: Periodic, first: datetime, through: datetime) -> tuple[int, datetime]:
    """How many ticks there are from ``first`` (a tick) to ``through`` (both
    included), up to ``MAX_COUNTED``, and the last of those counted.
    """
    ticks = itertools.takewhile(
        lambda t: t <= through, periodic.schedule.iter_ticks(first - _MICROSECOND)
    )
    count, last = 0, first
    for tick in itertools.islice(ticks, MAX_COUNTED):
        count, last = count + 1, tick
    return count, last
