"""``jobkeeper jobs list|show``, ``retry`` and ``cancel``: look at jobs and act on them."""

from __future__ import annotations

import click

from jobkeeper.cli import render
from jobkeeper.cli.common import (
    IDS_MAY_LOOK_LIKE_OPTIONS,
    BadInput,
    Command,
    Group,
    console,
    err_console,
    job_id_argument,
    json_option,
    open_queue,
)
from jobkeeper.models import HELD_STATUSES, JobStatus

jobs_app = Group("jobs", help="Inspect jobs.", no_args_is_help=True)


def status_option(value: str | None) -> JobStatus | None:
    if value is None:
        return None
    try:
        return JobStatus(value)
    except ValueError:
        valid = ", ".join(s.value for s in JobStatus)
        raise BadInput(f"--status {value!r}: use one of {valid}") from None


@jobs_app.command("list")
@click.option(
    "--status",
    default=None,
    help="Only jobs in this status: " + ", ".join(s.value for s in JobStatus) + ".",
)
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("--limit", type=click.INT, default=50, help="At most this many (1-10000).")
@json_option
@click.pass_context
def jobs_list(
    ctx: click.Context, status: str | None, queue: str | None, limit: int, as_json: bool
) -> None:
    """List jobs, newest first."""
    jobs = open_queue(ctx).list_jobs(status=status_option(status), queue=queue, limit=limit)
    if as_json:
        render.print_json(console, [job.to_dict() for job in jobs])
    else:
        console.print(render.jobs_table(jobs))


@jobs_app.command("show", context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@job_id_argument
@json_option
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show one job with its errors and result."""
    job = open_queue(ctx).get_job(job_id)
    if job is None:
        err_console.print(f"error: no job with id {job_id}", highlight=False)
        ctx.exit(1)
    if as_json:
        render.print_json(console, job.to_dict())
    else:
        console.print(render.job_detail(job))


@click.command("retry", cls=Command, context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@job_id_argument
@click.pass_context
def retry(ctx: click.Context, job_id: int) -> None:
    """Run a dead, retryable, cancelled or completed job again now."""
    job = open_queue(ctx).retry(job_id)
    console.print(f"job {job.id} is {job.status.value}", highlight=False)


@click.command("cancel", cls=Command, context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@job_id_argument
@click.pass_context
def cancel(ctx: click.Context, job_id: int) -> None:
    """Cancel a pending job, or ask the worker running it to stop."""
    job = open_queue(ctx).cancel(job_id)
    held = job.status in HELD_STATUSES
    note = " (cancel requested; its worker will stop it)" if held else ""
    console.print(f"job {job.id} is {job.status.value}{note}", highlight=False)
