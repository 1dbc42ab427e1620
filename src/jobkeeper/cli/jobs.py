"""``jobkeeper jobs list|show``: look at jobs."""

from __future__ import annotations

import click

from jobkeeper.cli import render
from jobkeeper.cli.common import (
    COUNT,
    IDS_MAY_LOOK_LIKE_OPTIONS,
    JOB_ID,
    BadInput,
    Group,
    console,
    err_console,
    job_id_argument,
    json_option,
    open_queue,
)
from jobkeeper.models import JobStatus
from jobkeeper.waits import explain_wait

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
@click.option("--task", default=None, help="Only jobs of this task.")
@click.option(
    "--worker",
    "worker_id",
    default=None,
    help="Only the jobs this worker holds now (claimed or running; ids as in `status`).",
)
@click.option(
    "--after",
    type=JOB_ID,
    default=None,
    help="The next page: jobs listed after job ID (ids below it).",
)
@click.option("--limit", type=COUNT, default=50, help="At most this many (1-10000).")
@json_option
@click.pass_context
def jobs_list(
    ctx: click.Context,
    status: str | None,
    queue: str | None,
    task: str | None,
    worker_id: str | None,
    after: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first.

    A page with more after it ends (on stderr) with the --after ID of the next one.
    """
    if worker_id is not None and not worker_id.strip():
        raise BadInput("--worker must name a worker id (jobkeeper workers lists them), got ''")
    jq = open_queue(ctx)
    filters = {
        "status": status_option(status),
        "queue": queue,
        "task": task,
        "worker_id": worker_id,
    }
    jobs = jq.list_jobs(limit=limit, before=after, **filters)
    if as_json:
        render.print_json(console, [job.to_dict() for job in jobs])
        return
    console.print(render.jobs_table(jobs))
    # Keyset paging: the next page starts below the last id shown. A full
    # page asks for one more row, so that the last page offers no next one.
    if jobs and len(jobs) == limit and jq.list_jobs(limit=1, before=jobs[-1].id, **filters):
        err_console.print(
            f"more follow: add --after {jobs[-1].id} for the next page",
            markup=False,
            highlight=False,
        )


@jobs_app.command("show", context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@job_id_argument
@json_option
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show one job with its errors and result, and why it waits.

    For a job that has not run: not due yet, its queue paused or at its
    concurrency or rate limit, its serial key held by another job, claimed
    by a worker, no live worker serving its queue.
    """
    jq = open_queue(ctx)
    job = jq.get_job(job_id)
    if job is None:
        err_console.print(f"error: no job with id {job_id}", highlight=False)
        ctx.exit(1)
    reasons = explain_wait(jq, job)
    if as_json:
        render.print_json(
            console, {**job.to_dict(), "waiting": [reason.to_dict() for reason in reasons]}
        )
    else:
        console.print(render.job_detail(job, waiting=[reason.message for reason in reasons]))
