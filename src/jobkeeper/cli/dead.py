"""``jobkeeper dead list|requeue|purge``: the dead letters."""

from __future__ import annotations

import click

from jobkeeper.cli import render
from jobkeeper.cli.common import (
    COUNT,
    DECIMAL_NUMBER,
    IDS_MAY_LOOK_LIKE_OPTIONS,
    JOB_ID,
    Argument,
    BadInput,
    Group,
    confirm,
    console,
    err_console,
    json_option,
    open_queue,
    yes_option,
)
from jobkeeper.config import check_age
from jobkeeper.models import JobStatus

dead_app = Group("dead", help="Inspect and requeue dead letters.", no_args_is_help=True)


@dead_app.command("list")
@click.option("--queue", default=None, help="Only this queue.")
@click.option("--limit", type=COUNT, default=50, help="At most this many (1-10000).")
@json_option
@click.pass_context
def dead_list(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """List dead letters, newest first."""
    jobs = open_queue(ctx).list_jobs(status=JobStatus.DEAD, queue=queue, limit=limit)
    if as_json:
        render.print_json(console, [job.to_dict() for job in jobs])
    else:
        console.print(render.jobs_table(jobs, title="dead letters"))


@dead_app.command("requeue", context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("job_ids", cls=Argument, type=JOB_ID, nargs=-1, doc="Dead letter ids.")
@click.option("--all", "all_", is_flag=True, help="Requeue every dead letter (asks first).")
@yes_option
@click.pass_context
def dead_requeue(ctx: click.Context, job_ids: tuple[int, ...], all_: bool, yes: bool) -> None:
    """Move dead letters back to the queue, attempts reset. --all asks first
    (--yes: no question).
    """
    if bool(job_ids) == all_:
        raise BadInput("dead requeue: give job ids or --all (not both)")
    jq = open_queue(ctx)
    if all_ and not yes:
        confirm("requeue every dead letter?", "requeue")
    moved = jq.requeue_dead(None if all_ else list(job_ids))
    missing = sorted(set(job_ids) - set(moved))
    if moved:
        noun = "job" if len(moved) == 1 else "jobs"
        console.print(f"requeued {len(moved)} {noun}: {_some(moved)}", highlight=False)
    elif all_:
        console.print("requeued 0 jobs (there are no dead letters)", highlight=False)
    if missing:
        # Like `jobs show` / `retry` / `cancel` on an unknown id: one error
        # line, exit 1 (the ids that were dead letters are requeued all the same).
        err_console.print(
            f"error: not dead letters: {' '.join(map(str, missing))}",
            highlight=False,
            soft_wrap=True,
        )
        ctx.exit(1)


#: Ids a requeue names before it says how many more it moved (--all may move
#: a hundred thousand).
SHOWN_IDS = 20


def _some(ids: list[int]) -> str:
    shown = " ".join(map(str, ids[:SHOWN_IDS]))
    return shown if len(ids) <= SHOWN_IDS else f"{shown} and {len(ids) - SHOWN_IDS} more"


@dead_app.command("purge", context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("job_ids", cls=Argument, type=JOB_ID, nargs=-1, doc="Dead letter ids.")
@click.option("--all", "all_", is_flag=True, help="Delete every dead letter (asks first).")
@click.option(
    "--older-than",
    type=DECIMAL_NUMBER,
    default=None,
    help="Only dead letters that died more than this many seconds ago (asks first).",
)
@yes_option
@click.pass_context
def dead_purge(
    ctx: click.Context,
    job_ids: tuple[int, ...],
    all_: bool,
    older_than: float | None,
    yes: bool,
) -> None:
    """Delete dead letters for good (their history goes with them). --all and
    --older-than ask first (--yes: no question).
    """
    if sum((bool(job_ids), all_, older_than is not None)) != 1:
        raise BadInput("dead purge: give job ids, --all or --older-than SECONDS (one of them)")
    if older_than is not None:
        check_age("older_than", older_than)  # refused before the question
    jq = open_queue(ctx)
    if not job_ids and not yes:
        which = (
            "every dead letter"
            if all_
            else f"the dead letters that died more than {older_than:g} s ago"
        )
        confirm(f"delete {which} for good?", "delete them")
    deleted = jq.purge_dead(list(job_ids) or None, older_than=older_than)
    noun = "dead letter" if len(deleted) == 1 else "dead letters"
    console.print(f"deleted {len(deleted)} {noun}", highlight=False)
    missing = sorted(set(job_ids) - set(deleted))
    if missing:
        err_console.print(
            f"error: not dead letters: {' '.join(map(str, missing))}",
            highlight=False,
            soft_wrap=True,
        )
        ctx.exit(1)
