"""Rich tables for people and the stable ``--json`` output for scripts.

The JSON shapes are part of the CLI contract: keys are only ever added.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table

from jobkeeper.cli.streams import as_stdout_takes
from jobkeeper.config import heartbeat_age, is_stale
from jobkeeper.errors import printable, printable_json
from jobkeeper.models import Job, JobStatus, WorkerInfo
from jobkeeper.periodic import PeriodicRow
from jobkeeper.queues import QueueInfo
from jobkeeper.version import split_worker_version


def escape(text: str) -> str:
    """``text`` for a Rich table cell: its markup escaped, and its control
    characters too (a job's error or result holds what its task put there;
    an ESC would reach the terminal), and what stdout cannot encode.
    """
    return escape_markup(as_stdout_takes(printable(text)))


STATUS_STYLE = {
    "scheduled": "cyan",
    "available": "blue",
    "claimed": "bright_yellow",
    "running": "yellow",
    "retryable": "magenta",
    "completed": "green",
    "cancelled": "dim",
    "dead": "red",
}


def print_json(console: Console, value: Any) -> None:
    """Print ``value`` as indented JSON (plain text, no markup), with what
    :func:`~jobkeeper.errors.printable` escapes written as JSON escapes.
    """
    text = json.dumps(value, ensure_ascii=False, default=str, indent=2)
    console.out(printable_json(text), highlight=False)


def _when(value: datetime | None) -> str:
    # Not strftime: its %Y writes the year 1 as "1", not "0001".
    return "" if value is None else value.replace(tzinfo=None).isoformat(" ", "seconds")


#: Longest result shown by ``jobs show`` and error shown by ``jobs list``, in
#: characters (``--json`` prints them whole).
MAX_RESULT_CHARS = 2_000
MAX_LISTED_ERROR_CHARS = 80


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out;
    whole when the saying would be longer than what it leaves out.
    """
    note = f"… ({len(text) - limit:,} more characters; --json shows all)"
    if len(text) <= limit + len(note):
        return text
    return text[:limit] + note


def _status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def _state_cell(worker: WorkerInfo, now: datetime, rescue_after: float) -> str:
    """``live`` (green) or ``stale (no heartbeat for 42s)`` (red)."""
    if not is_stale(worker, now, rescue_after):
        return "[green]live[/]"
    return f"[red]stale (no heartbeat for {heartbeat_age(worker, now):.0f}s)[/]"


def status_json(
    stats: dict[str, dict[str, int]],
    workers: list[WorkerInfo],
    *,
    now: datetime,
    rescue_after: float,
) -> dict[str, Any]:
    """``{"queues": {queue: {status: n}}, "totals": {status: n}, "workers": [...]}``.

    Each worker also has ``heartbeat_age`` (seconds, database clock) and
    ``stale`` (silent for longer than its own ``rescue_after``; see
    :func:`is_stale`), and ``rescue_after`` (seconds, ``null`` for workers of
    older versions).
    """
    totals = {status.value: 0 for status in JobStatus}
    for per_status in stats.values():
        for status, count in per_status.items():
            totals[status] += count
    return {
        "queues": stats,
        "totals": totals,
        "workers": [
            {
                "id": w.id,
                "hostname": w.hostname,
                "pid": w.pid,
                "queues": w.queues,
                "started_at": w.started_at.isoformat(),
                "heartbeat_at": w.heartbeat_at.isoformat(),
                "heartbeat_age": round(heartbeat_age(w, now), 3),
                "version": w.version,
                # The schema version the worker's code expects; None for a
                # build that recorded its release alone.
                "schema_version": split_worker_version(w.version)[1],
                "stale": is_stale(w, now, rescue_after),
                "rescue_after": w.rescue_after,
            }
            for w in workers
        ],
    }


#: Count columns: right-aligned, and folded onto a second line when narrow.
#: Rich's default overflow cut 123456 to "1234…" beside a long queue name on
#: a terminal of 80 columns: a wrong number, shown as if right. Folded, like
#: every column of ``jobs list``, nothing of it is lost.
COUNT_COLUMN: dict[str, Any] = {"justify": "right", "overflow": "fold"}


def status_table(stats: dict[str, dict[str, int]]) -> Table:
    table = Table(title="jobs by queue and status")
    table.add_column("queue", overflow="fold")
    for status in JobStatus:
        table.add_column(_status(status.value), **COUNT_COLUMN)
    for queue, per_status in stats.items():
        table.add_row(escape(queue), *(str(per_status.get(s.value, 0)) for s in JobStatus))
    if not stats:
        table.add_row("(no jobs)", *("" for _ in JobStatus))
    return table


def workers_table(workers: list[WorkerInfo], *, now: datetime, rescue_after: float) -> Table:
    table = Table(title="workers")
    for column in ("id", "queues", "started", "last heartbeat", "state", "version"):
        table.add_column(column, overflow="fold")
    for w in workers:
        table.add_row(
            escape(w.id),
            escape(",".join(w.queues)),
            _when(w.started_at),
            _when(w.heartbeat_at),
            _state_cell(w, now, rescue_after),
            # No version: a worker from before versions were recorded, which
            # ignores queue settings (pause, limits). A release without
            # "(schema N)": a build from before workers recorded it.
            escape(w.version or "(old)"),
        )
    return table


def jobs_table(jobs: list[Job], title: str = "jobs") -> Table:
    table = Table(title=title)
    columns = ("id", "queue", "task", "status", "attempt", "prio", "scheduled", "worker")
    for column in (*columns, "last error"):
        table.add_column(column, overflow="fold")
    for job in jobs:
        last_error = job.errors[-1].get("error", "") if job.errors else ""
        table.add_row(
            str(job.id),
            job.queue,
            job.task,
            _status(job.status.value),
            f"{job.attempt}/{job.max_attempts}",
            str(job.priority),
            _when(job.scheduled_at),
            escape(job.worker_id or ""),
            escape(_clip(str(last_error), MAX_LISTED_ERROR_CHARS)),
        )
    return table


def job_detail(job: Job, waiting: list[str] | None = None) -> Table:
    """``jobs show``: every field that is set, the args, the result, each
    error, and the reasons it waits (``waiting``, from :mod:`jobkeeper.waits`).
    """
    table = Table(show_header=False, title=f"job {job.id}")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    data = job.to_dict()
    for key in (
        "id",
        "task",
        "queue",
        "status",
        "priority",
        "attempt",
        "max_attempts",
        "fence",
        "unstarted_returns",
        "scheduled_at",
        "created_at",
        "attempted_at",
        "finished_at",
        "worker_id",
        "unique_key",
        "serial_key",
        "run_alone",
        "crashes",
        "cancel_requested",
        "dead_reason",
        "trace_context",
    ):
        value = data.get(key)
        if value is None or value is False:
            continue
        # Data is escaped: a "[/]" in it must print, not be parsed as markup.
        table.add_row(key, _status(str(value)) if key == "status" else escape(str(value)))
    table.add_row("args", escape(json.dumps(job.args, ensure_ascii=False)))
    if job.args_error:
        table.add_row("args_error", escape(job.args_error))
    if job.result is not None:
        result = json.dumps(job.result, ensure_ascii=False)
        table.add_row("result", escape(_clip(result, MAX_RESULT_CHARS)))
    for entry in job.errors:
        table.add_row(
            f"error (attempt {entry.get('attempt')})",
            escape(f"{entry.get('at')}  {entry.get('error')}"),
        )
    for reason in waiting or []:
        table.add_row("[yellow]waiting[/]", escape(reason))
    return table


def _periodic_state(row: PeriodicRow, now: datetime) -> str:
    if row.stale:
        return "[red]stale[/]"
    # Registered by a worker seen within stale_after, but its next tick has
    # passed unfired: that worker has stopped (or its passes fail).
    return "[yellow]overdue[/]" if row.overdue(now) else "[green]live[/]"


def periodic_table(rows: list[PeriodicRow], *, now: datetime) -> Table:
    """``periodic list``: one line per stored periodic, stale ones in red,
    overdue ones (a past next tick no worker fired) in yellow; ``now`` is
    the database clock.
    """
    table = Table(title="periodic jobs")
    for column in (
        "name",
        "schedule",
        "time zone",
        "task",
        "last tick (UTC)",
        "next tick (UTC)",
        "state",
    ):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            escape(row.name),
            escape(row.schedule),
            escape(row.timezone),
            escape(row.task),
            _when(row.last_tick_at),
            "" if row.stale else _when(row.next_tick_at),
            _periodic_state(row, now),
        )
    if not rows:
        table.add_row("(none)", "", "", "", "", "", "")
    return table


def queues_table(queues: list[QueueInfo]) -> Table:
    """``jobkeeper queues list``: each queue's settings and live counts."""
    table = Table(title="queues")
    columns = ("queue", "state", "concurrency", "rate limit", "max pending")
    for column in columns:
        table.add_column(column, overflow="fold")
    statuses = ("available", "claimed", "running", "scheduled", "retryable")
    for status in statuses:
        table.add_column(_status(status), **COUNT_COLUMN)
    for queue in queues:
        table.add_row(
            escape(queue.name),
            "[yellow]paused[/]" if queue.paused else "active",
            "-" if queue.concurrency is None else str(queue.concurrency),
            "-" if queue.rate_limit is None else queue.rate_limit,
            "-" if queue.max_pending is None else str(queue.max_pending),
            *(str(queue.counts.get(s, 0)) for s in statuses),
        )
    if not queues:
        table.add_row("(no queues)", *("" for _ in range(len(columns) + 4)))
    return table
