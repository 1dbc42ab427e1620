"""Inspecting and acting on jobs, dead letters and queues (the operator's API)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from jobkeeper.api.base import RETRYABLE_FROM, QueueBase, _job_id
from jobkeeper.api.flow_control import queue_info
from jobkeeper.config import check_age, check_name, check_seconds, is_int_between
from jobkeeper.errors import ConfigError, JobNotFound, JobStateError, UniqueKeyConflict, shown
from jobkeeper.models import (
    TERMINAL_STATUSES,
    Job,
    JobStatus,
    QueueCounts,
    WorkerInfo,
    requeue_clashes,
)
from jobkeeper.queues import (
    QueueInfo,
    QueueSettings,
)

#: Largest ``exact_below``: far past any table, and within the databases'
#: 64-bit integers (2**63 was refused as "bigint out of range" on PostgreSQL
#: and raised a bare OverflowError on SQLite).
MAX_EXACT_BELOW = 10**12


class OperationsMixin(QueueBase):
    """Inspect, act and flow-control methods of :class:`~jobkeeper.JobQueue`."""

    # -- inspect and act -------------------------------------------------------------

    def get_job(self, job_id: int) -> Job | None:
        """The job with ``job_id``, live, dead or recently completed; ``None`` if
        unknown (or pruned).
        """
        return self.backend.job_get(job_id=_job_id(job_id))

    def list_jobs(
        self,
        status: JobStatus | str | None = None,
        queue: str | None = None,
        limit: int = 100,
        *,
        task: str | None = None,
        before: int | None = None,
        worker_id: str | None = None,
    ) -> list[Job]:
        """Jobs newest first, filtered by ``status`` (``"dead"`` lists the dead
        letters), ``queue``, ``task`` and ``worker_id`` (the jobs that worker
        holds now: claimed or running); at most ``limit`` (1..10,000).

        Pages by keyset: pass the smallest id of one page as ``before`` to get
        the next (``WHERE id < before ORDER BY id DESC``), so a deep page costs
        what the first does.

        Raises:
            ConfigError: an unknown status, a bad limit, name or ``before``.
        """
        if status is not None:
            try:
                status = JobStatus(status)
            except ValueError:
                valid = ", ".join(s.value for s in JobStatus)
                raise ConfigError(f"unknown status {status!r}; valid: {valid}") from None
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ConfigError(f"limit must be an int between 1 and 10000, got {shown(limit)}")
        if queue is not None:
            check_name("queue", queue)
        if task is not None:
            check_name("task", task)
        if before is not None:
            before = _job_id(before)
        if worker_id is not None and (not isinstance(worker_id, str) or not worker_id):
            raise ConfigError(f"worker_id must be a non-empty str, got {shown(worker_id)}")
        return self.backend.job_list(
            status=status, queue=queue, limit=limit, task=task, before=before, worker_id=worker_id
        )

    def cancel(self, job_id: int) -> Job:
        """Cancel a job. Pending jobs become ``cancelled`` at once; a held
        (claimed or running) job's worker is asked to stop it (it ends
        ``cancelled`` within about one ``heartbeat_interval``, or, if its code
        cannot be interrupted, once that code returns: the job stays held until
        then). From then on the job ends ``cancelled`` whatever its attempt
        does next (fails, retries, times out, is handed back or rescued),
        unless the attempt succeeds first: then it stays ``completed``.

        Returns:
            The job after the request.

        Raises:
            JobNotFound: no such job.
            JobStateError: the job already finished (completed, cancelled or dead).
        """
        job = self.backend.job_cancel(job_id=_job_id(job_id))
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        if job.status in TERMINAL_STATUSES and job.status != JobStatus.CANCELLED:
            raise JobStateError(f"job {job_id} is {job.status.value}; it cannot be cancelled")
        return job

    def retry(
        self,
        job_id: int,
        *,
        if_status: JobStatus | str | Collection[JobStatus | str] | None = None,
        if_fence: int | None = None,
    ) -> Job:
        """Run a dead, retryable, cancelled or completed job again now, with its
        attempts reset (errors are kept). Dead jobs move back from the dead letters.

        Args:
            job_id: the job.
            if_status: retry only if the job is in this status (or one of
                these statuses) now: what a page showed, or what a filter
                selects; a job that completed since is not run again. The
                check and the change are one statement.
            if_fence: retry a live job only if its ``fence`` (bumped by every
                claim, never reset) is still this: one that ran again since,
                even back to the same status or through the dead letters, is
                not run again. Ignored for a dead letter. A requeue by a
                release before schema version 18 started the fence again at 0
                (the dashboard also compares its count of ``errors``, which
                such a round trip always grows).

        Raises:
            JobNotFound: no such job.
            JobStateError: the job is pending or running, or not ``if_status``
                (it changed meanwhile; nothing was changed), or a pending job of
                the same task holds its ``unique_key``.
            ConfigError: ``if_status`` is not a job status.
        """
        job_id = _job_id(job_id)
        allowed = RETRYABLE_FROM if if_status is None else _statuses(if_status)
        before = self.backend.job_get(job_id=job_id)
        if before is None:
            raise JobNotFound(f"no job with id {job_id}")
        if before.status not in RETRYABLE_FROM:
            raise JobStateError(
                f"job {job_id} is {before.status.value}; only dead, retryable, cancelled or "
                "completed jobs can be retried"
            )
        if before.status not in allowed:
            raise _changed(job_id, before.status, allowed)
        fence = None if if_fence is None or before.status == JobStatus.DEAD else if_fence
        if fence is not None and before.fence != fence:
            raise _ran_again(job_id, before.status, before.fence, fence)
        try:
            job = self.backend.job_retry(
                job_id=job_id,
                # Never from a status a retry does not apply to (running...),
                # whatever if_status names: the job may be there by now.
                statuses=sorted(status.value for status in allowed & RETRYABLE_FROM),
                fence=fence,
            )
        except UniqueKeyConflict:
            if before.status == JobStatus.DEAD:
                raise self._requeue_refused([job_id]) from None
            raise JobStateError(
                f"job {job_id} cannot be retried: a pending job of the same task "
                "already holds its unique_key"
            ) from None
        if job is None:
            now = self.backend.job_get(job_id=job_id)
            if now is None:
                raise JobNotFound(f"job {job_id} was pruned before it could be retried")
            if now.status in allowed and fence is not None:
                raise _ran_again(job_id, now.status, now.fence, fence)
            raise _changed(job_id, now.status, allowed)
        return job

    def requeue_dead(self, job_ids: Sequence[int] | None = None) -> list[int]:
        """Move dead letters back to the queue (all of them when ``job_ids`` is
        None), attempts reset. Returns the ids moved.

        Raises:
            JobStateError: a pending job of the same task holds one's ``unique_key``;
                nothing was moved.
        """
        ids = None if job_ids is None else [_job_id(i) for i in job_ids]
        try:
            return self.backend.dead_letter_requeue(job_ids=ids)
        except UniqueKeyConflict:
            raise self._requeue_refused(ids) from None

    def _requeue_refused(self, job_ids: Sequence[int] | None) -> JobStateError:
        """The error for a requeue refused by the unique index, naming the
        dead letters in the way and what holds their keys.
        """
        clashes: list[str] = []
        conflicts = self.backend.dead_letter_requeue_conflicts(job_ids=job_ids)
        for conflict, instead in requeue_clashes(conflicts):
            what = (
                f"dead letter {conflict.dead_letter_id} "
                f"(task {conflict.task!r}, unique_key {conflict.unique_key!r})"
            )
            if instead is None:
                clashes.append(f"{what} is held by pending job {conflict.holder}")
            else:
                clashes.append(f"{what} clashes with dead letter {instead}")
        shown = "; ".join(clashes[:3]) or "a pending job of the same task holds a unique_key"
        more = f" (and {len(clashes) - 3} more)" if len(clashes) > 3 else ""
        return JobStateError(f"cannot requeue: {shown}{more}; nothing was requeued")

    def purge_dead(
        self, job_ids: Sequence[int] | None = None, *, older_than: float | None = None
    ) -> list[int]:
        """Delete dead letters for good: those of ``job_ids`` (all of them when
        None) that died more than ``older_than`` seconds ago (any age when
        None). Returns the ids deleted; ids that are not dead letters are
        ignored.

        Raises:
            ConfigError: a bad id or a negative ``older_than``.
        """
        ids = None if job_ids is None else [_job_id(i) for i in job_ids]
        if older_than is not None:
            check_age("older_than", older_than)
        return self.backend.dead_letter_purge(job_ids=ids, older_than=older_than)

    def stats(self) -> dict[str, dict[str, int]]:
        """``{queue: {status: count}}`` with every status (zeros included), dead
        letters counted as ``"dead"``. Exact: it reads every row, finished
        ones too (about 0.3 s per 2 million rows on PostgreSQL), at each call;
        :meth:`queue_counts` counts them once a minute at most.
        """
        counts = self.backend.queue_stats()
        return {
            queue: {status.value: per_status.get(status.value, 0) for status in JobStatus}
            for queue, per_status in sorted(counts.items())
        }

    def workers(self) -> list[WorkerInfo]:
        """Registered workers and their last heartbeat."""
        return self.backend.worker_list()

    def queue_counts(self, exact_below: int = 100_000, *, recount: bool = True) -> QueueCounts:
        """Jobs per queue and status (dead letters as ``"dead"``): what the
        dashboard and ``/metrics`` show.

        Live statuses (scheduled, available, claimed, running, retryable) are
        always exact, read from their partial indexes. ``completed`` and
        ``cancelled`` are exact while the two together hold at most
        ``exact_below`` rows, and ``dead`` while the dead letters do. Above
        that, this queue's backend counts them all: the first such call
        waits for the count (0.2-0.8 s per 2 million rows on PostgreSQL,
        1.3-2 s on SQLite, on 2 cores); later calls add the rows finished
        since it (at most ``exact_below + 1``, read down the finished index)
        while a thread recounts once the count is 60 s old, or 20 times what
        it took (the approach of River UI, riverqueue/riverui#655); a call
        that finds the count three times as old as that (a quiet spell)
        waits for a new one. Rows pruned or dead letters added or removed
        since the last count show at the next. Jobs finished in the 2 s
        before a count are read as recent (an ack committing as it starts
        would be in neither count otherwise): while more than
        ``exact_below + 1`` finish within 2 s, the count falls short by the
        excess, and a job completed in a transaction open longer than 2 s
        (``complete_in``) as a recount starts is missed until the next.

        With ``recount=False``, or while a recount fails (a
        ``statement_timeout`` shorter than it: logged, tried again a minute
        later, or 20 times as long as it ran), nothing counts every row:
        above the cap each queue shows what the newest ``exact_below + 1``
        rows hold, a lower bound (0 for a queue with none among them).
        Either way the statuses counted above the cap are named in
        ``QueueCounts.estimated``, and those shown as a lower bound also in
        ``QueueCounts.lower_bound``.

        Raises:
            ConfigError: ``exact_below`` is not an int from 1 to ``MAX_EXACT_BELOW``.
        """
        if not is_int_between(exact_below, 1, MAX_EXACT_BELOW):
            raise ConfigError(
                f"exact_below must be an int from 1 to {MAX_EXACT_BELOW:,}, "
                f"got {shown(exact_below)}"
            )
        return self.backend.queue_counts(exact_below=exact_below, recount=recount)

    def oldest_due(self) -> dict[str, tuple[int, float]]:
        """Per queue with work due, its oldest job that could run now
        (available, or scheduled/retryable and past due): ``{queue: (job id,
        seconds since it became due)}``. The queue's latency.
        """
        return self.backend.queue_oldest_due()

    def throughput(
        self, since: float = 3600.0, bucket: float = 60.0
    ) -> list[tuple[datetime, dict[str, int]]]:
        """Jobs finished (``completed``, ``cancelled``) per ``bucket`` seconds
        over the last ``since`` seconds, oldest bucket first, empty buckets
        included: ``[(bucket start (UTC), {status: count})]``. Reads the
        finished index. A bucket closed more than a minute ago is counted
        once per process and kept (at most 10,000 per ``bucket`` size, for 4
        sizes), so a repeated call reads only the rows of the last minute or
        two; the first costs what the window holds. So, in this process,
        jobs pruned (``retention``) after their bucket was counted stay
        counted, a job finished, retried and finished again counts in both
        buckets, and a finish committed more than a minute after it began
        by the database clock (a ``complete_in`` transaction held that long,
        or a forward step of that clock meanwhile) is not counted. A step
        back of that clock forgets the kept buckets.

        Raises:
            ConfigError: ``since`` or ``bucket`` not positive, ``bucket``
                under 1 ms or longer than ``since``, ``since`` over 100 years,
                or over 10,000 buckets.
        """
        check_age("since", since)
        check_seconds("bucket", bucket, allow_zero=False)
        if since == 0 or bucket < 0.001 or bucket > since:
            raise ConfigError(
                "since must be > 0 and bucket from 0.001 s to since, got "
                f"since={since!r}, bucket={bucket!r}"
            )
        if since / bucket > 10_000:
            raise ConfigError(
                f"since/bucket is {since / bucket!r} buckets; at most 10000 "
                f"(since={since!r}, bucket={bucket!r})"
            )
        series = self.backend.job_throughput(since_seconds=since, bucket_seconds=bucket)
        return [(datetime.fromtimestamp(start, UTC), counts) for start, counts in series.items()]

    def health(self) -> dict[str, Any]:
        """Facts about the database that ``jobkeeper doctor`` judges (see
        :meth:`jobkeeper.backends.base.Backend.database_health`).

        Raises:
            DatabaseUnavailable: the database cannot be reached.
            DatabaseError: jobkeeper's jobs table exists with no schema
                version recorded (``jobkeeper_schema`` emptied or dropped).
        """
        return self.backend.database_health()

    def queues(self, exact_below: int = 100_000, *, recount: bool = True) -> list[QueueInfo]:
        """Every queue that has settings, live jobs, dead letters or finished
        jobs, by name, with its settings and its jobs per status (every
        status, zeros included), counted as :meth:`queue_counts` counts with
        ``exact_below``: exact for live jobs, and for finished jobs and dead
        letters up to ``exact_below`` rows; past that, from the last recount
        (``recount=False``: a lower bound from the newest rows, and a queue
        with only older finished jobs is left out) and named in each
        :attr:`QueueInfo.estimated`.

        Raises:
            ConfigError: ``exact_below`` is not an int from 1 to ``MAX_EXACT_BELOW``.
        """
        stored = {s.name: s for s in self.backend.queue_settings_list()}
        counted = self.queue_counts(exact_below, recount=recount)
        counts = counted.counts
        return [
            queue_info(
                stored.get(name, QueueSettings(name)),
                {status.value: counts.get(name, {}).get(status.value, 0) for status in JobStatus},
                counted,
            )
            for name in sorted(stored.keys() | counts.keys())
        ]


def _statuses(value: JobStatus | str | Collection[JobStatus | str]) -> set[JobStatus]:
    if isinstance(value, str):
        return {_status(value)}
    statuses = {_status(one) for one in value}
    if not statuses:
        raise ConfigError("if_status must name at least one job status, got none")
    return statuses


def _status(value: JobStatus | str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        raise ConfigError(
            f"if_status must be a job status ({', '.join(s.value for s in JobStatus)}), "
            f"got {value!r}"
        ) from None


def _changed(
    job_id: int, status: JobStatus, expected: frozenset[JobStatus] | set[JobStatus]
) -> JobStateError:
    wanted = " or ".join(sorted(s.value for s in expected))
    return JobStateError(
        f"job {job_id} is {status.value} now, not {wanted}: it changed meanwhile, and "
        "nothing was changed"
    )


def _ran_again(job_id: int, status: JobStatus, fence: int, expected: int) -> JobStateError:
    return JobStateError(
        f"job {job_id} is {status.value} at fence {fence}, not {expected}: it ran again "
        "since, and nothing was changed"
    )
