"""Reads of the dashboard, ``/metrics`` and ``doctor`` whose logic is the same
on every database (internal).

A backend mixes this in and supplies ``_fetch`` (a named query, rows as dicts
keyed by the column aliases), ``_now_param`` and ``_release_thread``; only the
SQL differs and it lives in each backend's ``queries.sql`` under the
method's name. The reads use the partial indexes of the live statuses or stop
at a cap; only the recount of the finished rows and dead letters grows with
what ``retention`` keeps, and it runs at most once a minute (see
:class:`Tally`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from jobkeeper.errors import JobkeeperError
from jobkeeper.models import QueueCounts

logger = logging.getLogger("jobkeeper.cockpit")

#: The finished statuses that may hold more rows than the exact limit.
_CAPPED_STATUSES = ("completed", "cancelled")
#: A recount runs again no sooner than this (seconds) after the last...
RECOUNT_EVERY = 60.0
#: ...and no sooner than this many times as long as the last one took, so
#: recounts keep to a twentieth of one database connection's time.
RECOUNT_SPACING = 20.0
#: A tally older than this many of its intervals is not shown while a thread
#: recounts: the read counts first (after a quiet spell, the first page
#: loaded would show a count of hours ago).
RECOUNT_EXPIRES = 3.0
#: The recount of finished rows counts those finished this long (seconds)
#: before it starts; later ones are counted as recent at each read. An ack
#: stamps finished_at when its transaction begins and commits after: one
#: stamped before the recount's snapshot but committed after it would be in
#: neither count if the two met at that instant.
RECOUNT_MARGIN = 2.0
#: A throughput bucket is counted for good once it closed this long ago
#: (seconds), for the reason of ``RECOUNT_MARGIN`` but longer: a kept bucket
#: is never read again, and worker acks held up by a lock (helper-66: 6 s)
#: commit as late as that after the finished_at they stamp. A reload reads
#: this much more, about 11,000 rows at 660,000 jobs an hour.
THROUGHPUT_SETTLED = 60.0
#: Closed buckets kept per bucket size (the API's most per call), and sizes kept.
THROUGHPUT_KEPT = 10_000
THROUGHPUT_SIZES = 4
#: The (queue, priority) pairs of available jobs that ``queue_oldest_due``
#: walks down the claim index (about 0.02 ms each); past that, one pass over
#: every available job finds the oldest instead.
OLDEST_WALK_PAIRS = 500
#: Seconds the database clock may fall behind this process's between two
#: throughput reads before the kept buckets are forgotten (a step back).
CLOCK_STEP = 5.0


@dataclass(frozen=True)
class Tally:
    """An exact count of the rows of one kind (finished jobs or dead letters)
    per queue and status, kept between reads above the cap.

    Borrowed from River UI (riverqueue/riverui#655): a capped count answers
    each read, and once it hits the cap, an exact count taken now and then,
    by its own cost, answers instead of a planner's estimate, which dropped
    queues and could be 20 times off.
    """

    #: None: no recount has succeeded (the reads fall back to the capped sample).
    counts: dict[str, dict[str, int]] | None
    #: Database time up to which ``counts`` holds the finished rows (None
    #: for dead letters, which have no index by time).
    upto: Any
    #: ``time.monotonic()`` when the recount behind ``counts`` started, and
    #: what it took (s).
    counted: float
    took: float
    #: When a recount was last tried (monotonic), and whether it failed then.
    tried: float
    failed: bool = False

    def interval(self) -> float:
        """Seconds from one recount to the next."""
        return max(RECOUNT_EVERY, RECOUNT_SPACING * self.took)

    def due(self, now: float, *, soon: bool = False) -> bool:
        """Whether the next recount may start at ``now`` (monotonic);
        ``soon``: without waiting for ``RECOUNT_EVERY``, only for the spacing
        (more rows finished since this count than the cap). After a failure,
        only once the interval has passed, ``soon`` or not.
        """
        wait = RECOUNT_SPACING * self.took if soon and not self.failed else self.interval()
        return now - self.tried >= wait

    def expired(self, now: float) -> bool:
        """Whether ``counts`` is too old to show (see ``RECOUNT_EXPIRES``)."""
        return self.counts is not None and now - self.counted > RECOUNT_EXPIRES * self.interval()

    def tried_again(self, now: float, *, failed: bool) -> Tally:
        """This tally, with a recount tried at ``now`` that did not replace it."""
        return Tally(self.counts, self.upto, self.counted, self.took, now, failed)


def _add_rows(
    counts: dict[str, dict[str, int]], rows: Iterable[dict[str, Any]]
) -> dict[str, dict[str, int]]:
    """Add each count row (``queue``, ``status``, ``n``; the dead letters'
    have no status: ``dead``) into ``counts``; returns ``counts``.
    """
    for row in rows:
        per_queue = counts.setdefault(row["queue"], {})
        status = row.get("status", "dead")
        per_queue[status] = per_queue.get(status, 0) + int(row["n"])
    return counts


def _total(rows: Iterable[dict[str, Any]]) -> int:
    """The rows counted by count rows."""
    return sum(int(row["n"]) for row in rows)


class _Tallies:
    """A backend's tallies, and which of them a thread is recounting."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tallies: dict[str, Tally] = {}
        self.running: set[str] = set()
        #: Per kind, held by the caller taking a tally in its own thread.
        self.counting: dict[str, threading.Lock] = {}
        #: Per kind, bumped when its tally is forgotten: a recount that
        #: started before must not store what it counted.
        self.generation: dict[str, int] = {}

    def store(self, kind: str, tally: Tally, generation: int) -> Tally | None:
        """Keep ``tally`` unless the kind was forgotten since ``generation``
        or a newer recount was stored meanwhile; returns what is kept.
        """
        with self.lock:
            if self.generation.get(kind, 0) != generation:
                return self.tallies.get(kind)
            kept = self.tallies.get(kind)
            if kept is None or kept.counts is None:
                newer = True
            elif tally.counts is None:  # nothing to show: only in place of what expired
                newer = kept.expired(time.monotonic())
            else:
                newer = tally.counted >= kept.counted
            if newer:
                self.tallies[kind] = tally
            return self.tallies[kind]


class _Buckets:
    """Closed throughput buckets counted by this process, per bucket size:
    counted once, they do not change (a bucket is kept only once it closed
    ``THROUGHPUT_SETTLED`` seconds ago; rows pruned later stay counted, and
    so does a finish that a retry and a second finish overwrote).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: bucket size -> {bucket number: {status: count}}, sizes in use order.
        self.sizes: dict[float, dict[int, dict[str, int]]] = {}
        #: The database clock at the last read, and ``time.monotonic()`` then.
        self.clock: tuple[float, float] | None = None

    def check_clock(self, now: float, asked: float, answered: float) -> None:
        """Forget every kept bucket if the database clock (``now``, Unix
        seconds, asked for at ``asked`` and answered at ``answered``, both
        ``time.monotonic()``) went back since the last read: buckets kept
        while it ran ahead were not settled (``lock`` held). The clocks are
        compared over the least time that can have passed between the two
        readings, so a slow answer is not taken for a step.
        """
        if self.clock is not None:
            last_now, last_answered = self.clock
            if now - last_now < asked - last_answered - CLOCK_STEP:
                self.sizes.clear()
        self.clock = (now, answered)

    def of_size(self, size: float) -> dict[int, dict[str, int]]:
        """The kept buckets of ``size`` seconds (``lock`` held)."""
        kept = self.sizes.pop(size, None)
        self.sizes[size] = kept = {} if kept is None else kept
        while len(self.sizes) > THROUGHPUT_SIZES:
            del self.sizes[next(iter(self.sizes))]
        return kept

    @staticmethod
    def trim(kept: dict[int, dict[str, int]]) -> None:
        """Drop the oldest of ``kept`` past ``THROUGHPUT_KEPT``."""
        if len(kept) > THROUGHPUT_KEPT:
            for number in sorted(kept)[: len(kept) - THROUGHPUT_KEPT]:
                del kept[number]


class CockpitReads:
    """The dashboard's and doctor's operations of the Backend Protocol."""

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _now_param(self, now: datetime | None) -> Any:
        raise NotImplementedError

    def db_now(self) -> datetime:
        raise NotImplementedError

    def _release_thread(self) -> None:
        """Let go of what this thread holds (its SQLite connection): the
        thread is about to end.
        """
        raise NotImplementedError

    def _ids_param(self, job_ids: Sequence[int] | None) -> Any:
        raise NotImplementedError

    def queue_counts_live(self) -> dict[str, dict[str, int]]:
        return _add_rows({}, self._fetch("queue_counts_live"))

    def queue_counts(self, *, exact_below: int, recount: bool = True) -> QueueCounts:
        counts = self.queue_counts_live()
        estimated: set[str] = set()
        lower_bound: set[str] = set()
        cap = exact_below + 1
        finished = self._fetch("queue_counts_finished", {"cap": cap})
        if _total(finished) > exact_below:
            estimated.update(_CAPPED_STATUSES)
            counted = self._finished_above_cap(cap) if recount else None
            if counted is None:
                lower_bound.update(_CAPPED_STATUSES)
            else:
                finished = counted
        else:
            self._forget_tally("finished")
        dead = self._fetch("queue_counts_dead", {"cap": cap})
        if _total(dead) > exact_below:
            estimated.add("dead")
            tally = self._tally("dead") if recount else None
            if tally is None:
                lower_bound.add("dead")
            else:
                dead = self._tally_rows(tally)
        else:
            self._forget_tally("dead")
        _add_rows(counts, (*finished, *dead))
        return QueueCounts(
            counts=counts, estimated=frozenset(estimated), lower_bound=frozenset(lower_bound)
        )

    def queue_counts_of(self, *, queue: str, exact_below: int) -> QueueCounts:
        counts: dict[str, int] = {}
        sampled = {"finished": 0, "dead": 0}  # every queue's rows in the capped samples
        for row in self._fetch("queue_counts_of_queue", {"queue": queue, "cap": exact_below + 1}):
            if row["n"]:
                counts[row["status"]] = int(row["n"])
            if row["sampled"] is not None:
                sampled["dead" if row["status"] == "dead" else "finished"] += int(row["sampled"])
        estimated = set(_CAPPED_STATUSES) if sampled["finished"] > exact_below else set()
        if sampled["dead"] > exact_below:
            estimated.add("dead")
        for kind in ("finished", "dead"):
            if sampled[kind] <= exact_below:
                self._forget_tally(kind)
        # Never recounted here: an estimate is the sample's lower bound.
        shown = frozenset(estimated)
        return QueueCounts({queue: counts} if counts else {}, shown, shown)

    def _finished_above_cap(self, cap: int) -> list[dict[str, Any]] | None:
        """The finished rows per queue and status once more than ``cap``
        exist: the last recount, plus the rows finished since it (up to
        ``cap`` of them; more start a recount). None: no recount to go by.
        """
        tally = self._tally("finished")
        if tally is None:
            return None
        recent = self._fetch("queue_counts_finished_since", {"since": tally.upto, "cap": cap})
        if _total(recent) >= cap:
            self._tally("finished", soon=True)
        return [*self._tally_rows(tally), *recent]

    @staticmethod
    def _tally_rows(tally: Tally) -> list[dict[str, Any]]:
        return [
            {"queue": queue, "status": status, "n": n}
            for queue, per_status in (tally.counts or {}).items()
            for status, n in per_status.items()
        ]

    def _tallies(self) -> _Tallies:
        kept: _Tallies | None = self.__dict__.get("_kept_tallies")
        return kept or self.__dict__.setdefault("_kept_tallies", _Tallies())

    def _forget_tally(self, kind: str) -> None:
        """Below the cap again: a later rise starts from a new count, not
        from one taken before the rows that made it fall were removed.
        """
        kept = self._tallies()
        if kind in kept.tallies or kind in kept.running:
            with kept.lock:
                kept.tallies.pop(kind, None)
                kept.generation[kind] = kept.generation.get(kind, 0) + 1

    def _tally(self, kind: str, *, soon: bool = False) -> Tally | None:
        """The recount of ``kind`` (``"finished"`` or ``"dead"``), or None
        when none succeeded (logged; retried in a thread after
        ``RECOUNT_EVERY``). The first runs in the caller, which has nothing
        better to show, and so does one whose counts expired; a due one runs
        in a thread of its own while the last answers (``soon``: see
        :meth:`Tally.due`).
        """
        kept = self._tallies()
        now = time.monotonic()
        with kept.lock:
            tally = kept.tallies.get(kind)
            if tally is not None and tally.expired(now):
                tally = None
            elif tally is not None and kind not in kept.running and tally.due(now, soon=soon):
                self._start_recount(kept, kind)
            counting = kept.counting.setdefault(kind, threading.Lock())
        if tally is None:
            with counting:
                # Callers that came together: one counts, the others wait
                # for its tally.
                generation = kept.generation.get(kind, 0)
                tally = kept.tallies.get(kind)
                if tally is None or tally.expired(time.monotonic()):
                    tally = kept.store(kind, self._recount_or_note(kind, tally), generation)
        return tally if tally is not None and tally.counts is not None else None

    def _start_recount(self, kept: _Tallies, kind: str) -> None:
        """Start a thread recounting ``kind`` (``kept.lock`` held)."""
        thread = threading.Thread(
            target=self._recount_in_background,
            args=(kept, kind, kept.generation.get(kind, 0)),
            name=f"jobkeeper-recount-{kind}",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: tried again when due
            logger.warning("jobkeeper: could not start the recount of the %s jobs: %s", kind, exc)
            last = kept.tallies[kind]
            kept.tallies[kind] = last.tried_again(time.monotonic(), failed=True)
        else:
            kept.running.add(kind)

    def _recount_in_background(self, kept: _Tallies, kind: str, generation: int) -> None:
        try:
            kept.store(kind, self._recount_or_note(kind, kept.tallies.get(kind)), generation)
        finally:
            with kept.lock:
                kept.running.discard(kind)
            self._release_thread()

    def _recount_or_note(self, kind: str, last: Tally | None) -> Tally:
        """A new recount of ``kind``; when it fails (a statement_timeout
        shorter than it, the database gone), ``last`` marked as failed now,
        so that the next try waits an interval: the reads keep its counts
        until they expire, then fall back to the capped sample.
        """
        started = time.monotonic()
        try:
            return self._recount(kind)
        except JobkeeperError as exc:
            logger.warning("jobkeeper: recount of the %s jobs failed: %s", kind, exc)
            if last is None or last.expired(started):
                took = time.monotonic() - started
                return Tally(None, None, started, took, started, failed=True)
            return last.tried_again(started, failed=True)

    def _recount(self, kind: str) -> Tally:
        started = time.monotonic()
        if kind == "dead":
            upto = None
            rows = self._fetch("queue_counts_dead_all")
        else:
            upto = self._now_param(self.db_now() - timedelta(seconds=RECOUNT_MARGIN))
            rows = self._fetch("queue_counts_finished_upto", {"upto": upto})
        return Tally(_add_rows({}, rows), upto, started, time.monotonic() - started, started)

    def queue_oldest_due(self) -> dict[str, tuple[int, float]]:
        rows = self._fetch("queue_oldest_due", {"pairs": OLDEST_WALK_PAIRS})
        if sum(1 for row in rows if row["walked"]) > OLDEST_WALK_PAIRS:
            # Too many priorities to walk: one pass over the available jobs.
            rows = [row for row in rows if not row["walked"]]
            rows += self._fetch("queue_oldest_due_spread")
        oldest: dict[str, tuple[float, int, float]] = {}
        for row in rows:
            candidate = (float(row["at"]), int(row["id"]), max(float(row["age"]), 0.0))
            kept = oldest.get(row["queue"])
            if kept is None or candidate[:2] < kept[:2]:
                oldest[row["queue"]] = candidate
        return {queue: (job_id, age) for queue, (_, job_id, age) in oldest.items()}

    def job_throughput(
        self, *, since_seconds: float, bucket_seconds: float
    ) -> dict[float, dict[str, int]]:
        # Buckets by number (start / bucket_seconds): the settled ones come
        # from this process's kept counts, and the read starts at the first
        # bucket not kept, so a reload reads only the buckets not settled.
        asked = time.monotonic()
        now = self.db_now().timestamp()
        answered = time.monotonic()
        first = math.floor((now - since_seconds) / bucket_seconds) + 1
        current = math.floor(now / bucket_seconds)
        settled = math.floor((now - THROUGHPUT_SETTLED) / bucket_seconds)
        buckets = self._buckets()
        with buckets.lock:
            buckets.check_clock(now, asked, answered)
            kept = buckets.of_size(bucket_seconds)
            start = first
            while start < settled and start in kept:
                start += 1
        since = datetime.fromtimestamp(start * bucket_seconds, UTC)
        params = {"from": self._now_param(since), "bucket": bucket_seconds}
        read: dict[int, dict[str, int]] = {}
        for row in self._fetch("job_throughput", params):
            read.setdefault(int(row["bucket"]), {})[row["status"]] = int(row["n"])
        with buckets.lock:
            # The same dict as above: another size's reads may have dropped
            # it from ``buckets`` meanwhile, not its buckets from it.
            for number in range(start, settled):
                kept[number] = read.get(number, {})
            buckets.trim(kept)
            # Copies: a caller that edits its answer must not edit the kept counts.
            return {
                n * bucket_seconds: dict(kept.get(n, {})) if n < settled else read.get(n, {})
                for n in range(first, current + 1)
            }

    def _buckets(self) -> _Buckets:
        kept: _Buckets | None = self.__dict__.get("_kept_buckets")
        return kept or self.__dict__.setdefault("_kept_buckets", _Buckets())

    def dead_letter_purge(
        self, *, job_ids: Sequence[int] | None, older_than: float | None
    ) -> list[int]:
        params = {
            "ids": self._ids_param(job_ids),
            "all_ids": job_ids is None,
            "older_than": older_than,
        }
        return sorted(int(row["id"]) for row in self._fetch("dead_letter_purge", params))

    def job_serial_holders(self, *, serial_key: str) -> list[int]:
        return [
            int(row["id"]) for row in self._fetch("job_serial_holders", {"serial_key": serial_key})
        ]

    def queue_starts_count(self, *, queue: str, period: float) -> int:
        rows = self._fetch("queue_starts_count", {"queue": queue, "period": period})
        return int(rows[0]["n"]) if rows else 0


def json_ids(job_ids: Sequence[int] | None) -> str:
    """Ids as a JSON array, for SQLite's ``json_each``."""
    return json.dumps(list(job_ids or []))
