"""``jobkeeper enqueue``: add one job."""

from __future__ import annotations

from datetime import datetime

import click

from jobkeeper.api import JobQueue
from jobkeeper.cli import render
from jobkeeper.cli.args_json import parse_args_json, read_args_text
from jobkeeper.cli.common import (
    COUNT,
    DECIMAL_NUMBER,
    WHOLE_NUMBER,
    Argument,
    BadInput,
    Command,
    console,
    json_option,
    open_queue,
)
from jobkeeper.cli.loading import open_app_queue
from jobkeeper.tasks import suggest

#: How many of an app's task names an unknown-task error lists.
_TASKS_SHOWN = 10


def _check_task_known(jq: JobQueue, task: str, app_spec: str) -> None:
    """With ``--app`` the task must be one of the app's (or one it declares
    in ``external_tasks``): a typo would otherwise enqueue a job no worker of
    that app can run. ``--external`` skips this.

    Raises:
        BadInput: naming the task, the closest name, (up to ten of) the app's
            task names and the switch.
    """
    declared = jq.external_tasks
    if task in jq.tasks or declared is True or (declared is not False and task in declared):
        return
    names = sorted(jq.tasks)
    if not names:
        known = "it defines no tasks"
    else:
        shown = ", ".join(names[:_TASKS_SHOWN])
        more = f" and {len(names) - _TASKS_SHOWN} more" if len(names) > _TASKS_SHOWN else ""
        known = f"its tasks: {shown}{more}"
    raise BadInput(
        f"--app {app_spec!r} has no task {task!r}{suggest(task, names)}; {known} "
        "(--external enqueues it anyway, for a task another service runs)"
    )


def _parse_run_at(text: str) -> datetime:
    """``--run-at`` as an aware datetime.

    Raises:
        BadInput: not ISO 8601, or without an offset (a time without one
            would be read in some machine's zone: case C-11).
    """
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(
            f"--run-at {text!r}: not an ISO 8601 time, e.g. 2026-12-24T09:00:00+01:00"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise BadInput(
            f"--run-at {text!r}: give its offset (+01:00, or Z for UTC): a time without one "
            "means different moments on different machines"
        )
    return when


@click.command("enqueue", cls=Command)
@click.argument("task", cls=Argument, doc="The task's registered name.")
@click.option(
    "--args",
    default="{}",
    help="Arguments as a JSON object; @FILE reads it from a file, - from stdin.",
)
@click.option(
    "--app",
    "app_spec",
    default=None,
    help="Your JobQueue (package.module:attribute): the task's own queue, "
    "priority and max_attempts apply and its arguments are checked.",
)
@click.option("--queue", default=None, help="Queue (default: default).")
@click.option("--delay", type=DECIMAL_NUMBER, default=None, help="Seconds from now, >= 0.")
@click.option(
    "--run-at",
    default=None,
    help="Not before this time: ISO 8601 with its offset, e.g. 2026-12-24T09:00:00+01:00 "
    "or ...Z (not with --delay).",
)
@click.option("--priority", type=WHOLE_NUMBER, default=None, help="Lower runs first.")
@click.option("--max-attempts", type=COUNT, default=None, help="Attempts before dead.")
@click.option(
    "--unique-key",
    default=None,
    help="Skip if a job of this task with this key is scheduled, available, claimed, "
    "running or retryable (print that job's id).",
)
@click.option(
    "--external",
    is_flag=True,
    help="The task is run by another service's workers: enqueue it even though "
    "--app registers no task of that name.",
)
@json_option
@click.pass_context
def enqueue(
    ctx: click.Context,
    task: str,
    args: str,
    app_spec: str | None,
    queue: str | None,
    delay: float | None,
    run_at: str | None,
    priority: int | None,
    max_attempts: int | None,
    unique_key: str | None,
    external: bool,
    as_json: bool,
) -> None:
    """Enqueue one job and print its id (--json: the stored job, its queue
    and status included, as `jobs show --json` prints it without "waiting").
    """
    if run_at is not None and delay is not None:
        raise BadInput("give --run-at or --delay, not both")
    when = None if run_at is None else _parse_run_at(run_at)
    jq = open_app_queue(ctx, app_spec) if app_spec is not None else open_queue(ctx)
    limit = jq.settings.max_payload_bytes
    payload = parse_args_json(read_args_text(args, max_payload_bytes=limit))
    if app_spec is not None and not external:
        _check_task_known(jq, task, app_spec)
    job = jq.enqueue(
        task,
        payload,
        queue=queue,
        delay=delay,
        run_at=when,
        priority=priority,
        max_attempts=max_attempts,
        unique_key=unique_key,
        external=external,
    )
    if as_json:
        render.print_json(console, job.to_dict())
    else:
        console.print(job.id, highlight=False)
