"""Why a job is not running: what ``jobkeeper jobs show`` prints under a
waiting job (Sidekiq's and Oban Web's "why is this job stuck" notes).

Each reason is read from the database the way the claim itself judges it:
the database clock for due times, ``jobkeeper_queues`` for pause and limits,
the rate window of ``jobkeeper_queue_starts``, the holders of a serial key,
the registered workers' heartbeats (judged as the rescuer judges them),
and the crash suspects they hold (a worker running one alone claims nothing).
A client of the API, like the CLI and the dashboard.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from jobkeeper.api import JobQueue
from jobkeeper.config import holder_window
from jobkeeper.models import Job, JobStatus, WorkerInfo
from jobkeeper.queues import QueueSettings, enforces_queue_settings, format_rate_limit

#: The statuses of a job that has not started: reasons apply to these.
_WAITING = (JobStatus.SCHEDULED, JobStatus.AVAILABLE, JobStatus.RETRYABLE)


@dataclasses.dataclass(frozen=True, slots=True)
class WaitReason:
    """One reason a job waits.

    Attributes:
        code: stable, for ``--json``: ``not_due``, ``claimed``, ``running``,
            ``holder_silent``, ``paused``, ``concurrency``, ``rate_limit``,
            ``serial_key``, ``no_worker``, ``old_workers``, ``lone_attempt``,
            ``backlog``.
        message: one line for people, saying what to do where there is something.
    """

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """``{"code": ..., "message": ...}``."""
        return {"code": self.code, "message": self.message}


def _silence(worker: WorkerInfo, now: datetime) -> float:
    return max(0.0, (now - worker.heartbeat_at).total_seconds())


def _is_live(worker: WorkerInfo, now: datetime, rescue_after: float) -> bool:
    return _silence(worker, now) <= holder_window(worker.rescue_after, rescue_after)


def live_workers(jq: JobQueue) -> list[WorkerInfo]:
    """The registered workers that are alive: not silent past their own
    rescue window, judged as rescuers judge them (the database clock).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    now = jq.backend.db_now()
    return [w for w in jq.workers() if _is_live(w, now, jq.settings.rescue_after)]


def _when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def explain_wait(jq: JobQueue, job: Job) -> list[WaitReason]:
    """Why ``job`` has not run (yet), most telling first; empty for a
    finished job (completed, cancelled, dead).

    Args:
        jq: the queue the job is in (its database is read: a few small queries).
        job: the job, as :meth:`JobQueue.get_job` returned it.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    if job.status not in (*_WAITING, JobStatus.CLAIMED, JobStatus.RUNNING):
        return []
    backend = jq.backend
    now = backend.db_now()
    rescue_after = jq.settings.rescue_after
    workers = {worker.id: worker for worker in jq.workers()}
    if job.status in (JobStatus.CLAIMED, JobStatus.RUNNING):
        return _held(job, workers, now, rescue_after)
    reasons: list[WaitReason] = []
    if job.scheduled_at is not None and job.scheduled_at > now:
        wait = (job.scheduled_at - now).total_seconds()
        what = "waits out its retry backoff" if job.status == JobStatus.RETRYABLE else "is not due"
        reasons.append(
            WaitReason("not_due", f"it {what} until {_when(job.scheduled_at)} (in {wait:.0f}s)")
        )
    settings = {s.name: s for s in backend.queue_settings_list()}.get(job.queue)
    if settings is not None:
        reasons += _queue_limits(jq, job.queue, settings)
    if job.serial_key is not None:
        holders = [i for i in backend.job_serial_holders(serial_key=job.serial_key) if i != job.id]
        if holders:
            held_by = ", ".join(str(i) for i in holders)
            reasons.append(
                WaitReason(
                    "serial_key",
                    f"its serial key {job.serial_key!r} is held by job {held_by} "
                    "(one job of a key at a time)",
                )
            )
    reasons += _serving(job.queue, list(workers.values()), now, rescue_after, settings)
    if not reasons:
        reasons += _lone_attempts(jq, job.queue, list(workers.values()), now, rescue_after)
    if not reasons:
        counts = jq.backend.queue_counts_live().get(job.queue, {})
        ahead = counts.get("available", 0) - (1 if job.status == JobStatus.AVAILABLE else 0)
        held = counts.get("claimed", 0) + counts.get("running", 0)
        reasons.append(
            WaitReason(
                "backlog",
                f"it is due and a live worker serves queue {job.queue!r}: it starts once "
                f"a worker has a free slot ({max(ahead, 0)} other available, {held} held "
                "in the queue; lower priority numbers and older jobs go first)",
            )
        )
    return reasons


def _held(
    job: Job, workers: dict[str, WorkerInfo], now: datetime, rescue_after: float
) -> list[WaitReason]:
    holder = job.worker_id or "?"
    if job.status == JobStatus.CLAIMED:
        reasons = [
            WaitReason(
                "claimed",
                f"it is claimed by worker {holder} (prefetched: it starts when that "
                "worker has a free slot)",
            )
        ]
    else:
        since = f" since {_when(job.attempted_at)}" if job.attempted_at else ""
        reasons = [WaitReason("running", f"it is running on worker {holder}{since}")]
    worker = workers.get(holder)
    if worker is None or not _is_live(worker, now, rescue_after):
        silent = f"for {_silence(worker, now):.0f}s" if worker else "(not registered)"
        reasons.append(
            WaitReason(
                "holder_silent",
                f"worker {holder} has sent no heartbeat {silent}: the job will be rescued "
                "and run again once its rescue_after has passed",
            )
        )
    return reasons


def _lone_attempts(
    jq: JobQueue, queue: str, workers: list[WorkerInfo], now: datetime, rescue_after: float
) -> list[WaitReason]:
    """``lone_attempt`` when every live worker serving ``queue`` holds a
    crash suspect (``run_alone``): it waits for the worker's other jobs to
    end, then runs alone, and its worker claims nothing until it ends. Its
    slots look free, but nothing takes this job ("it starts once a worker
    has a free slot" said otherwise).
    """
    live = [w for w in workers if queue in w.queues and _is_live(w, now, rescue_after)]
    lone: list[str] = []
    for worker in live:
        suspects = [j for j in jq.backend.job_held_by(worker_id=worker.id) if j.run_alone]
        if not suspects:
            return []  # this one claims as usual: the backlog's turn
        lone += [
            f"job {j.id} {'runs' if j.status == JobStatus.RUNNING else 'waits to run'} "
            f"alone on worker {worker.id}"
            for j in sorted(suspects, key=lambda j: j.id)
        ]
    if not lone:
        return []
    return [
        WaitReason(
            "lone_attempt",
            f"every live worker serving queue {queue!r} is given over to a lone attempt "
            f"and claims nothing else until it ends ({'; '.join(lone)}): a job rescued "
            "from a worker that went silent runs its next attempt alone (max_crashes), "
            "for as long as its task runs (its timeout bounds that)",
        )
    ]


def _queue_limits(jq: JobQueue, queue: str, settings: QueueSettings) -> list[WaitReason]:
    reasons: list[WaitReason] = []
    if settings.paused:
        reasons.append(
            WaitReason("paused", f"queue {queue!r} is paused (jobkeeper queues resume {queue})")
        )
    if settings.concurrency is not None:
        counts = jq.backend.queue_counts_live().get(queue, {})
        held = counts.get("claimed", 0) + counts.get("running", 0)
        if held >= settings.concurrency:
            reasons.append(
                WaitReason(
                    "concurrency",
                    f"queue {queue!r} is at its concurrency limit: {held} of "
                    f"{settings.concurrency} jobs held on all workers",
                )
            )
    if settings.rate_limit is not None and settings.rate_period is not None:
        started = jq.backend.queue_starts_count(queue=queue, period=settings.rate_period)
        if started >= settings.rate_limit:
            rate = format_rate_limit(settings.rate_limit, settings.rate_period)
            reasons.append(
                WaitReason(
                    "rate_limit",
                    f"queue {queue!r} is at its rate limit {rate}: {started} started in "
                    f"the last {settings.rate_period:g}s",
                )
            )
    return reasons


def _serving(
    queue: str,
    workers: list[WorkerInfo],
    now: datetime,
    rescue_after: float,
    settings: QueueSettings | None,
) -> list[WaitReason]:
    serving = [w for w in workers if queue in w.queues]
    live = [w for w in serving if _is_live(w, now, rescue_after)]
    if not live:
        stale = f" ({len(serving)} registered but silent)" if serving else ""
        return [
            WaitReason(
                "no_worker",
                f"no live worker serves queue {queue!r}{stale}: start one with "
                f"jobkeeper worker --app ... --queue {queue}",
            )
        ]
    old = [w for w in live if not enforces_queue_settings(w.version)]
    if old and settings is not None:
        names = ", ".join(w.id for w in old)
        return [
            WaitReason(
                "old_workers",
                f"worker {names} runs a jobkeeper from before queue settings "
                "(it ignores pause and limits): upgrade it",
            )
        ]
    return []
