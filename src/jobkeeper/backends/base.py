"""The backend seam: one method per database operation.

Method names are ``noun_verb`` and equal the names of the queries in each
backend's ``queries.sql`` (River's driver interface and ``-- name:`` queries).
Every state-changing write on a held job is fenced on ``(id, worker_id,
attempt, fence)`` and returns the ids it changed, so a worker that lost its claim
changes nothing.

Time is the database's: every timestamp written and every due-time or
heartbeat comparison uses the database clock (PostgreSQL ``now()``; SQLite's
``julianday('now')``, the host clock in UTC). The operations that compare
against the clock take an optional keyword-only ``now`` (an aware datetime)
that replaces it for that call: production passes nothing, tests pin time
(River's ``sqlc.narg('now')``, huey's ``now=None``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from jobkeeper.backends.surfaces import CockpitSeam, FlowSeam, PeriodicSeam, WaitSeam
from jobkeeper.config import MIGRATE_LOCK_WAIT
from jobkeeper.database_url import DatabaseURL
from jobkeeper.models import (
    Claim,
    Completion,
    Failure,
    Job,
    JobStatus,
    NewJob,
    RequeueConflict,
    Staging,
    WorkerInfo,
)

#: The statuses a job may be retried from (``"dead"``: a dead letter).
RETRY_STATUSES = ("dead", "retryable", "cancelled", "completed")


class Backend(CockpitSeam, PeriodicSeam, FlowSeam, WaitSeam, Protocol):
    """What the API, the worker and the maintenance services need from a database
    (the core's operations here, the rest in :mod:`~jobkeeper.backends.surfaces`).
    """

    #: ``"sqlite"`` or ``"postgresql"``.
    name: str
    #: The database (logs name it with :meth:`DatabaseURL.redacted`).
    url: DatabaseURL
    #: Most jobs per slot a worker's adaptive prefetch may hold.
    prefetch_per_slot: int

    def dedicated(
        self,
        role: str = "",
        *,
        stuck_after: float | None = None,
        stopping: threading.Event | None = None,
    ) -> Backend:
        """A backend on the same database with its own single connection, for
        one worker thread (heartbeats and acks must never wait behind task work).

        Args:
            role: what the connection is for, shown where the database shows
                one (PostgreSQL: ``application_name`` "jobkeeper <role>",
                unless the user names the session: the URL, ``PGAPPNAME``,
                or ``-c application_name=`` in ``options`` or ``PGOPTIONS``).
            stuck_after: seconds a call may go without an answer before it
                is checked on (PostgreSQL: its connection is cut when the
                server is not running it; None: the default, 10 s; SQLite
                has no network and ignores it).
            stopping: set when the connection's owner begins to stop (a
                worker's stop): from then on a call is checked on after 1 s
                at most (PostgreSQL; SQLite ignores it).
        """
        ...

    def close(self) -> None:
        """Close every connection this instance opened. Idempotent."""
        ...

    def migrate(self, *, lock_wait: float = MIGRATE_LOCK_WAIT) -> int:
        """Apply pending migrations under a lock; return the schema version.

        Args:
            lock_wait: seconds to wait in all for the locks migrate takes
                (PostgreSQL: in attempts of ``LOCK_TIMEOUT`` seconds with
                pauses between, so that no enqueue or claim queues behind
                the wait for long; SQLite: the write lock).

        Raises:
            SchemaLockTimeoutError: a lock was not had within ``lock_wait``;
                nothing was written (a ``DatabaseUnavailable``).
        """
        ...

    def schema_version(self, *, lock_wait: float | None = None) -> int:
        """The applied schema version, 0 when not migrated.

        Args:
            lock_wait: seconds to wait for a lock held on ``jobkeeper_schema``
                (a TRUNCATE or DROP in an open transaction) before giving up
                with ``DatabaseUnavailable``; None waits as long as it takes.
                PostgreSQL only: SQLite's reads (WAL) never wait on a writer.

        Raises:
            DatabaseError: jobkeeper's jobs table exists with no version
                recorded (``jobkeeper_schema`` emptied or dropped).
        """
        ...

    def schema_expected(self) -> int:
        """The schema version this code migrates to (its newest migration)."""
        ...

    def db_now(self) -> datetime:
        """The database clock, in UTC."""
        ...

    # -- jobs --------------------------------------------------------------

    def job_insert_many(self, *, jobs: Sequence[NewJob], connection: Any = None) -> list[Job]:
        """Insert jobs in one transaction (or in the caller's ``connection``'s
        transaction, uncommitted). A job whose ``(task, unique_key)`` matches a
        pending job is not inserted; the pending job is returned in its place.
        Returns one Job per input, in input order. A ``NewJobStream`` (see
        ``BackendEntry.streams_inserts``) that refuses an item writes nothing.
        """
        ...

    def job_claim(self, *, worker_id: str, queue: str, limit: int) -> list[Job]:
        """Atomically move up to ``limit`` available jobs of ``queue`` to
        claimed under ``worker_id``, counting the attempt and bumping the
        fence. Ordered by priority, scheduled_at, id.
        """
        ...

    def queues_with_available(self, *, queues: Sequence[str]) -> list[str]:
        """Which of ``queues`` hold an available job (status ``available``,
        the only rows any :meth:`job_claim` takes), in the order given, in one
        statement. A queue whose settings (paused, a cap, a rate) let a claim
        take none of them is still listed: the claim decides. A worker serving
        many queues asks this before it claims, instead of claiming from each.
        """
        ...

    def job_start_many(self, *, claims: Sequence[Claim]) -> set[int]:
        """Record start marks: fenced claimed jobs become running (their task
        is being called). Returns the ids written.
        """
        ...

    def job_abandon_many(self, *, claims: Sequence[Claim]) -> set[int]:
        """A stopping worker gives up on these running attempts (their code
        did not return after the interrupt): they stay held for the rescue,
        which counts the attempt but pins no crash on them (their
        ``alone_fence`` is cleared). Returns the ids written.
        """
        ...

    def job_start_alone(self, *, claim: Claim) -> bool:
        """Record the start mark of a ``run_alone`` job its worker starts
        alone (nothing else runs there until it ends): running, fenced on
        ``claim``, and that claim's fence kept in ``alone_fence``, so that a
        rescue of this attempt counts as a crash pinned on the job. Returns
        whether it was written (False: the claim is no longer held).
        """
        ...

    def job_complete_many(self, *, completions: Sequence[Completion], delete: bool) -> set[int]:
        """Mark fenced held (claimed or running) jobs completed (or delete them when ``delete``);
        return the ids written.
        """
        ...

    def job_complete_in(self, *, connection: Any, completion: Completion, delete: bool) -> bool:
        """Complete the held job of ``completion.claim`` on the caller's
        ``connection`` (psycopg 3 ``Connection`` / ``sqlite3.Connection``), in
        its transaction, uncommitted, fenced as :meth:`job_complete_many`
        (deleted instead when ``delete``). Returns False when the fence
        matched nothing (the claim was lost). Raises ``TypeError`` for a
        connection of another kind or to another database.
        """
        ...

    def job_completed_in(self, *, claims: Sequence[Claim], delete: bool) -> set[int]:
        """The ids of ``claims`` whose job is completed at that claim's
        fence (with ``delete``: also those whose row is gone): a refused
        outcome of these was refused because ``complete_in`` committed.
        """
        ...

    def installation_get(self) -> str:
        """The database's random installation value (drawn at migration)."""
        ...

    def job_fail_many(
        self, *, failures: Sequence[Failure], stale_after: float | None = None
    ) -> set[int]:
        """Record failed attempts, fenced; per ``outcome``: retryable (after
        ``retry_in`` s), dead (moved to the dead letters), cancelled,
        released (available again, attempt not spent) or returned (the same,
        for a job still claimed, counted in ``unstarted_returns``). A job
        with a cancel request ends cancelled whatever the outcome. With ``stale_after``
        (seconds) a write also requires the holder's heartbeat to be older
        than that (the rescuer's re-check). Returns the ids written.
        """
        ...

    def job_stage_due(self, *, queues: Sequence[str] = (), now: datetime | None = None) -> Staging:
        """Move scheduled/retryable jobs (of every queue) whose ``scheduled_at``
        has passed to available; wake listeners. Jobs another session is
        staging at the same moment are skipped, not waited for.

        Returns how many moved, and (in the same statement, by the database
        clock) the seconds until the earliest scheduled/retryable job of
        ``queues`` that is not yet due comes due: 0 when due jobs were left
        for another pass, ``None`` when there is none (or no ``queues``).
        """
        ...

    def job_next_due_in(
        self, *, queues: Sequence[str], now: datetime | None = None
    ) -> float | None:
        """Seconds until a job of ``queues`` could be claimed: 0 while one is
        available in a queue that is not paused nor at its ``concurrency``
        and whose ``serial_key`` nobody holds; until its rate window frees a
        start in a queue at its ``rate_limit``; else until the earliest
        scheduled/retryable one is due (<= 0 when overdue). ``None``: none
        could without a queue being resumed or a held job ending.
        """
        ...

    def job_rescue_candidates(
        self, *, rescue_after: float, limit: int, now: datetime | None = None
    ) -> list[Job]:
        """Held (claimed or running) jobs whose holder has not heartbeaten for ``rescue_after``
        seconds (or has no worker row at all).
        """
        ...

    def job_cancel_requested(self, *, worker_id: str) -> list[Claim]:
        """Claims of ``worker_id`` whose jobs were asked to cancel."""
        ...

    def job_held_by(self, *, worker_id: str) -> list[Job]:
        """The jobs held (claimed or running) by ``worker_id``."""
        ...

    def job_confirm_holds(self, *, worker_id: str) -> list[Job]:
        """:meth:`job_held_by` as a holder back from a stale spell must read
        it before it starts a claimed job: once every rescue of these jobs
        already under way has ended, so that none can return a job after
        this answer counted it as held. May wait for such a rescue.
        """
        ...

    def job_prune_finished(
        self, *, older_than: float, limit: int, now: datetime | None = None
    ) -> int:
        """Delete up to ``limit`` completed/cancelled jobs finished more than
        ``older_than`` seconds ago; return how many.
        """
        ...

    def job_table_maintain(self, *, vacuum: bool) -> list[str]:
        """Refresh the planner's statistics of the jobs table when stale, and
        VACUUM it (when ``vacuum``) if the server does not autovacuum. Returns
        what was done (``["analyze"]``...). Skips work another session holds.
        """
        ...

    def job_get(self, *, job_id: int) -> Job | None:
        """A job by id, from the jobs table or the dead letters."""
        ...

    def job_list(
        self,
        *,
        status: JobStatus | None,
        queue: str | None,
        limit: int,
        task: str | None = None,
        before: int | None = None,
        worker_id: str | None = None,
    ) -> list[Job]:
        """Newest first; ``status=DEAD`` lists dead letters; ``None`` lists both.
        ``before``: only ids below it (keyset paging). ``worker_id``: only
        the jobs that worker holds now (dead letters are held by nobody).
        """
        ...

    def job_list_ids(
        self,
        *,
        statuses: Sequence[str],
        queue: str | None,
        task: str | None,
        before: int | None,
        limit: int,
    ) -> list[tuple[int, JobStatus]]:
        """``(id, status)`` of the jobs in one of ``statuses`` (``"dead"``:
        the dead letters) of ``queue`` and ``task`` (None: any), newest first,
        ids below ``before`` (keyset paging), at most ``limit``. One
        statement: a job moving meanwhile is listed once, as it was then.
        """
        ...

    def job_cancel(self, *, job_id: int) -> Job | None:
        """Cancel a pending job, or flag a held one for its worker to stop.
        Returns the job after the change (unchanged when finished), or None.
        """
        ...

    def job_cancel_many(self, *, job_ids: Sequence[int]) -> dict[int, JobStatus]:
        """:meth:`job_cancel` of each of ``job_ids`` in one statement: the
        jobs it changed, each with its status after (CANCELLED, or the held
        status of a job flagged for its worker). Finished and missing jobs
        are left out.
        """
        ...

    def job_retry(
        self, *, job_id: int, statuses: Sequence[str] = RETRY_STATUSES, fence: int | None = None
    ) -> Job | None:
        """Make the job available now with attempts reset, if it is in one of
        ``statuses`` (of ``RETRY_STATUSES``; ``"dead"``: a dead letter, moved
        back) and, given ``fence``, a live job still at that fence. Returns
        the job as retried, or None when nothing was retried (no such job, or
        not so now).

        Raises:
            UniqueKeyConflict: a pending job of the same task holds its unique_key.
        """
        ...

    def job_retry_many(
        self, *, job_ids: Sequence[int], statuses: Sequence[str] = RETRY_STATUSES
    ) -> list[int]:
        """:meth:`job_retry` of each of ``job_ids`` in turn, the newest
        (largest id) first as a filtered listing gives them, without a
        fence, in one statement (dead letters are left to
        :meth:`dead_letter_requeue`: ``"dead"`` in ``statuses`` is ignored).
        Where :meth:`job_retry` would raise UniqueKeyConflict (a pending job of
        the job's task holds its unique_key, or a newer one of ``job_ids``
        took it back first), that job is left out and the others retried.
        Returns the ids retried, ascending; jobs missing or not in
        ``statuses`` are left out.

        Raises:
            UniqueKeyConflict: a pending job holding one's key was committed
                while the statement ran; nothing was retried.
        """
        ...

    def dead_letter_requeue(self, *, job_ids: Sequence[int] | None) -> list[int]:
        """Move dead letters (all when ``job_ids`` is None) back to available;
        return the ids moved.

        Raises:
            UniqueKeyConflict: one's unique_key is held (nothing was moved).
        """
        ...

    def dead_letter_requeue_conflicts(
        self, *, job_ids: Sequence[int] | None
    ) -> list[RequeueConflict]:
        """Why a requeue of these dead letters (all when None) hit the unique
        index: each one with a ``unique_key``, and the pending job holding it.
        """
        ...

    def queue_stats(self) -> dict[str, dict[str, int]]:
        """``{queue: {status: count}}`` over the jobs table and dead letters."""
        ...

    # -- workers -----------------------------------------------------------

    def worker_register(self, *, worker: WorkerInfo) -> None:
        """Insert (or refresh) the worker's row with a fresh heartbeat."""
        ...

    def worker_heartbeat(self, *, worker: WorkerInfo) -> None:
        """Refresh ``heartbeat_at``; re-register if the row was pruned."""
        ...

    def worker_deregister(self, *, worker_id: str) -> None:
        """Delete the worker's row."""
        ...

    def worker_prune_stale(self, *, older_than: float, now: datetime | None = None) -> int:
        """Delete rows of workers silent for ``older_than`` seconds."""
        ...

    def worker_list(self) -> list[WorkerInfo]:
        """Every registered worker."""
        ...

    # -- leadership ---------------------------------------------------------

    def leader_try_acquire(
        self, *, name: str, worker_id: str, ttl: float, now: datetime | None = None
    ) -> bool:
        """Take the lease ``name`` for ``ttl`` seconds (database clock) when it
        is free or expired, or extend it when ``worker_id`` holds it. Returns
        whether ``worker_id`` holds it now.
        """
        ...

    def leader_resign(self, *, name: str, worker_id: str) -> None:
        """Give the lease up if ``worker_id`` holds it (a graceful stop)."""
        ...

    def leader_get(self, *, name: str) -> str | None:
        """The worker holding an unexpired lease ``name``, or None."""
        ...

    # -- wake-ups ----------------------------------------------------------

    def listen(
        self,
        *,
        on_queue: Callable[[str], None],
        stop: threading.Event,
        on_due: Callable[[str, float], None] | None = None,
    ) -> None:
        """Deliver wake-ups to a worker until ``stop`` is set: blocks, on a
        thread of its own (call it on a :meth:`dedicated` backend). Every
        backend implements it; a worker's producer waits on nothing else.

        ``on_queue(queue)``: jobs became available in ``queue``.
        ``on_queue("*")``: anything may have changed (the listener has just
        (re)connected, or another connection committed and the backend
        cannot tell what): look for work and stage due jobs soon.
        ``on_due(queue, seconds)``: a job of ``queue`` was enqueued to come
        due in ``seconds`` (a delayed enqueue; seconds by the database clock,
        as of the enqueue).

        It reconnects on its own. It may return before ``stop`` when
        wake-ups cannot work (PostgreSQL behind a pooler in transaction
        mode): workers then find jobs by staging every ``poll_interval``.
        """
        ...
