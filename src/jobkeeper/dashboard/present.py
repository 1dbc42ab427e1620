"""What the dashboard's templates show: durations, times, numbers, and why a
job waits.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jobkeeper.models import Job, JobStatus, WorkerInfo
from jobkeeper.periodic import PeriodicRow


def ago(then: datetime | None, now: datetime) -> str:
    """``then`` relative to ``now``: "12 s ago", "in 3 min", "—"."""
    if then is None:
        return "—"
    seconds = (now - then).total_seconds()
    text = duration(abs(seconds))
    if abs(seconds) < 1:
        return "just now"
    return f"{text} ago" if seconds > 0 else f"in {text}"


def duration(seconds: float) -> str:
    """A short human duration: "850 ms", "42 s", "3 min", "5 h 20 min", "2 d"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        hours, rest = divmod(seconds, 3600)
        return f"{hours:.0f} h {rest // 60:.0f} min" if rest >= 60 else f"{hours:.0f} h"
    return f"{seconds / 86400:.0f} d"


def stamp(value: datetime | None) -> str:
    """An absolute UTC time for tooltips and the job page."""
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def rate(value: float) -> str:
    """A rate with the digits that show it is not zero: "0", "0.033", "0.22",
    "1.5", "1,234". One decimal showed 2 jobs in an hour as "0.0" a minute,
    beside a chart that said "2 in all".
    """
    if value == 0:
        return "0"
    if value < 1:
        return f"{value:.2g}"
    if round(value, 1) < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def number(value: int) -> str:
    """Thousands separated: 1,234,567."""
    return f"{value:,}"


def pretty_json(value: Any) -> str:
    """A job's args or result as the JSON it is stored as, indented, for a
    ``<pre>`` (the template escapes it). Jinja's ``tojson`` wrote ``<``, ``>``,
    ``&`` and ``'`` as ``\\u003c`` and so on, so a URL's ``&`` showed as
    ``\\u0026`` where ``jobs show`` prints the stored text.
    """
    text = json.dumps(value, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: shown escaped, as stored
        text = json.dumps(value, indent=2)
    return text


def next_tick_note(row: PeriodicRow, now: datetime) -> str | None:
    """What the periodic page says beside a next tick no worker will fire
    on time (``None`` when a running worker schedules it): a past tick alone
    read as if it had run.
    """
    if row.overdue(now):
        if row.stale:
            return "overdue: no running worker schedules it"
        return "overdue: no worker has fired it"
    if row.stale:
        return "not scheduled: no running worker registers it"
    return None


def why_waiting(job: Job, workers: list[WorkerInfo], now: datetime) -> str | None:
    """One line on why a job has not run yet, from what is cheap to know
    (the job and the worker list); ``None`` for jobs that are not waiting.
    """
    if job.status == JobStatus.SCHEDULED:
        return f"Scheduled: it becomes available {ago(job.scheduled_at, now)}."
    if job.status == JobStatus.RETRYABLE:
        return (
            f"Waiting out its backoff after attempt {job.attempt} of {job.max_attempts}: "
            f"next attempt {ago(job.scheduled_at, now)}."
        )
    if job.status == JobStatus.RUNNING:
        return f"Running on worker {job.worker_id} since {ago(job.attempted_at, now)}."
    if job.status == JobStatus.CLAIMED:
        return (
            f"Claimed by worker {job.worker_id} {ago(job.attempted_at, now)}, waiting for one "
            "of its slots (prefetched); it starts there or is handed back unstarted."
        )
    if job.status != JobStatus.AVAILABLE:
        return None
    serving = [w for w in workers if job.queue in w.queues]
    if not serving:
        return f"No live worker serves queue {job.queue!r}: start one with --queue {job.queue}."
    return (
        f"Available for {ago(job.scheduled_at, now).removesuffix(' ago')}; "
        f"{len(serving)} worker(s) serve queue {job.queue!r} (it waits behind jobs "
        "of higher priority or older ones, or every slot is busy)."
    )
