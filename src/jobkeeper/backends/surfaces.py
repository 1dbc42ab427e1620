"""The parts of the backend seam that the features around the core use:
the cockpit's reads, periodic jobs, flow control, waiting and the async API.

:class:`~jobkeeper.backends.base.Backend` is all of them together with the
core's operations; the conventions of its docstring hold here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from jobkeeper.backends.watch import CompletionWatch
from jobkeeper.models import Job, NewJob, QueueCounts
from jobkeeper.periodic import Periodic, PeriodicRow, PeriodicTouch
from jobkeeper.queues import QueueSettings


class CockpitSeam(Protocol):
    """The reads and clean-ups of the dashboard, ``/metrics`` and ``doctor``."""

    def dead_letter_purge(
        self, *, job_ids: Sequence[int] | None, older_than: float | None
    ) -> list[int]:
        """Delete dead letters: those of ``job_ids`` (all when None) that died
        more than ``older_than`` seconds ago (any age when None). Returns the
        ids deleted.
        """
        ...

    def queue_remove(self, *, queue: str) -> int:
        """Delete everything stored under the queue ``queue``: its jobs (in any
        status), its dead letters, its settings and start records, and the
        periodic rows that enqueue into it (``jobkeeper verify``'s clean-up of
        its own queue). Returns the jobs and dead letters deleted.
        """
        ...

    def dead_letter_prune(
        self, *, older_than: float, limit: int, now: datetime | None = None
    ) -> int:
        """Delete up to ``limit`` dead letters that died more than
        ``older_than`` seconds ago (``dead_retention``); return how many.
        """
        ...

    def job_serial_holders(self, *, serial_key: str) -> list[int]:
        """Ids of the jobs holding ``serial_key`` now (claimed or running)."""
        ...

    def queue_starts_count(self, *, queue: str, period: float) -> int:
        """Jobs of ``queue`` started (claimed) in the last ``period`` seconds,
        as its rate limit counts them (only rate-limited queues record starts).
        """
        ...

    def queue_counts_live(self) -> dict[str, dict[str, int]]:
        """Jobs per queue and live status (scheduled, available, claimed,
        running, retryable), exact, from the partial indexes of those statuses.
        """
        ...

    def queue_counts(self, *, exact_below: int, recount: bool = True) -> QueueCounts:
        """Jobs per queue and status, dead letters as ``dead``. Live statuses
        exact; completed and cancelled exact while together at most
        ``exact_below`` rows (dead letters likewise), else the backend's last
        recount of them (at most a minute old, or 20 times what it took)
        plus the rows finished since it; ``recount=False``, or a recount
        that failed: what the newest ``exact_below + 1`` rows hold.
        """
        ...

    def queue_counts_of(self, *, queue: str, exact_below: int) -> QueueCounts:
        """The jobs of ``queue`` per status, as ``queue_counts`` counts them
        with ``recount=False`` (its ``counts`` holds ``queue`` alone, absent
        when it has no rows; ``estimated`` and ``lower_bound`` judged on the
        same samples of every queue's finished rows and dead letters),
        reading the live rows of ``queue`` only: a backlog in another queue
        costs nothing.
        """
        ...

    def connection_lock_wait(self, *, seconds: float | None) -> None:
        """Bound the calling thread's waits for SQLite's write lock to
        ``seconds`` (None: ``busy_timeout`` again; never longer than it), for
        the dashboard's threads, whose request is answered 503 at its
        ``database_timeout``: a write behind another connection's lock then
        gives up (``DatabaseUnavailable``, nothing written) instead of
        holding the thread for ``busy_timeout``. Other threads keep
        ``busy_timeout``. PostgreSQL: nothing (its connections are pooled,
        not a thread's).
        """
        ...

    def queue_oldest_due(self) -> dict[str, tuple[int, float]]:
        """Per queue with due work, its oldest job that could run now
        (available, or past due): ``{queue: (job id, seconds since due)}``.
        """
        ...

    def job_throughput(
        self, *, since_seconds: float, bucket_seconds: float
    ) -> dict[float, dict[str, int]]:
        """Jobs finished (completed, cancelled) per bucket of
        ``bucket_seconds``, for the buckets that start within the last
        ``since_seconds`` up to the current one, oldest first, by the one
        database clock reading the call makes:
        ``{bucket start (Unix seconds): {status: count}}``, empty buckets as
        ``{}``. A bucket closed more than ``THROUGHPUT_SETTLED`` seconds ago
        is counted once per process and kept (see ``cockpit.py``).
        """
        ...

    def database_health(self) -> dict[str, Any]:
        """Facts ``doctor`` judges: ``backend``, ``schema_version``,
        ``schema_expected``, ``claim_uses_index`` and ``claim_plan``; on
        PostgreSQL ``table`` (live/dead tuples, seconds since the last vacuum,
        autovacuum switches), ``xmin_holders``, ``notify_usage`` and ``encoding``
        (e.g. ``UTF8``); on SQLite ``journal_mode``, ``busy_timeout_ms``, ``wal_bytes``,
        or, when the file does not exist (schema version 0, nothing created),
        ``missing``: ``{"file": path, "directory": its path when missing too, else None}``.
        Once the database exists, ``write_error``: None when a write that
        needs new space (rolled back) succeeds, else why it failed (str).
        """
        ...


class PeriodicSeam(Protocol):
    """The periodic jobs' table (:mod:`jobkeeper.periodic`)."""

    def periodic_upsert(self, *, periodics: Sequence[Periodic]) -> None:
        """A worker's start: store its definitions, replacing what another
        definition of the same name stored (code is the source of truth), in
        one transaction. An unchanged schedule (same ``str(schedule)`` and time
        zone) keeps ``since_at``, ``last_tick_at`` and ``seen_at``; a new or
        changed one starts owing ticks from now (database clock).
        """
        ...

    def periodic_enqueue_tick(
        self,
        *,
        name: str,
        schedule: str,
        timezone: str,
        tick: datetime,
        next_tick: datetime | None,
    ) -> int | None:
        """Enqueue the job of one tick, atomically with its record: when the
        stored definition is ``(name, schedule, timezone)`` and ``tick`` is
        later than both ``since_at`` and ``last_tick_at``, set ``last_tick_at =
        tick`` and insert the job (``scheduled_at = tick``) in one transaction.

        Returns:
            The new job's id, or None when the tick was already enqueued (or
            skipped) by anyone, or the definition is not the caller's.
        """
        ...

    def periodic_skip(
        self,
        *,
        name: str,
        schedule: str,
        timezone: str,
        through: datetime,
        next_tick: datetime | None,
    ) -> bool:
        """Give up the ticks up to ``through`` (missed, and older than
        catch_up): ``since_at = through``, under the same conditions as
        :meth:`periodic_enqueue_tick`. Returns whether the row changed.
        """
        ...

    def periodic_touch(self, *, touches: Sequence[PeriodicTouch]) -> set[str]:
        """Set ``seen_at`` to now (and ``next_tick_at``) on each row whose stored
        definition is the toucher's; return the names refreshed.
        """
        ...

    def periodic_list(self, *, stale_after: float) -> list[PeriodicRow]:
        """Every ``jobkeeper_periodic`` row by name, ``stale`` when its
        ``seen_at`` is more than ``stale_after`` seconds old (database clock).
        """
        ...

    def periodic_prune(self, *, stale_after: float) -> list[str]:
        """Delete the rows stale by ``stale_after`` seconds; return their names."""
        ...


class FlowSeam(Protocol):
    """The queues' flow-control settings (:mod:`jobkeeper.queues`)."""

    def queue_settings_list(self, *, names: Sequence[str] | None = None) -> list[QueueSettings]:
        """The ``jobkeeper_queues`` rows (of ``names``; all when None), by name."""
        ...

    def queue_configure(self, *, name: str, changes: Mapping[str, Any]) -> QueueSettings:
        """Write the settings in ``changes`` (keys ``paused``, ``concurrency``,
        ``rate_limit`` as ``(count, period seconds)``, ``max_pending``; a
        value None lifts one) and keep the others; a row left with nothing
        set is deleted. Returns the settings now stored.
        """
        ...


class WaitSeam(Protocol):
    """Waiting for results, and the async producer API."""

    def job_mark_awaited(self, *, job_id: int) -> None:
        """Mark the job as waited for: its end wakes :meth:`completion_watch`'s waiters."""
        ...

    def completion_watch(self) -> CompletionWatch:
        """The process-wide watch of this database's job ends (one
        connection and thread per process, however many waiters).
        """
        ...

    async def job_insert_many_async(
        self, *, jobs: Sequence[NewJob], connection: Any = None
    ) -> list[Job]:
        """``job_insert_many`` without blocking the event loop; ``connection``
        is a psycopg ``AsyncConnection`` (PostgreSQL) or a ``sqlite3``
        connection (SQLite, written on the caller's thread).
        """
        ...

    async def job_get_async(self, *, job_id: int) -> Job | None:
        """``job_get`` without blocking the event loop."""
        ...

    async def job_mark_awaited_async(self, *, job_id: int) -> None:
        """``job_mark_awaited`` without blocking the event loop."""
        ...

    async def aclose(self) -> None:
        """Release what the async calls of the running loop hold."""
        ...
