"""``jobkeeper enqueue``: add one job."""

from __future__ import annotations

from datetime import datetime

import click

from jobkeeper.api import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, JobQueue
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
    err_console,
    json_option,
    open_queue,
)
from jobkeeper.cli.loading import open_app_queue
from jobkeeper.errors import JobkeeperError
from jobkeeper.models import Job
from jobkeeper.tasks import suggest
from jobkeeper.waits import live_workers

#: How many of an app's task names an unknown-task error lists.
_TASKS_SHOWN = 10
#: How many queue names the warning about an unserved queue lists.
_QUEUES_SHOWN = 10


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def defaults_warning(
    task: str, queue: str | None, priority: int | None, max_attempts: int | None
) -> str | None:
    """Without ``--app``: which settings the task may declare for itself
    the CLI cannot know, and the defaults it used instead (None when the
    options gave all three). A break-test's job went to ``default`` with 20
    attempts while its task said ``queue="images", max_attempts=5``, and no
    worker of the app served ``default``.
    """
    left = [
        (option, used)
        for option, value, used in (
            ("--queue", queue, f"queue {DEFAULT_QUEUE!r}"),
            ("--priority", priority, "priority 0"),
            ("--max-attempts", max_attempts, f"max_attempts {DEFAULT_MAX_ATTEMPTS}"),
        )
        if value is None
    ]
    if not left:
        return None
    return (
        f"without --app the CLI does not know the queue, priority and max_attempts task "
        f"{task!r} declares: it used jobkeeper's defaults, {_and([used for _, used in left])}; "
        f"pass --app package.module:jq to apply the task's own, or "
        f"{'/'.join(option for option, _ in left)}"
    )


def unserved_warning(jq: JobQueue, job: Job) -> str | None:
    """None when a live worker serves ``job``'s queue; else what the
    live workers serve, and that the job waits.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    live = live_workers(jq)
    if any(job.queue in worker.queues for worker in live):
        return None
    served = sorted({queue for worker in live for queue in worker.queues})
    if served:
        more = len(served) - _QUEUES_SHOWN
        shown = ", ".join(served[:_QUEUES_SHOWN]) + (f" and {more} more" if more > 0 else "")
        who = f"live workers serve {shown}"
    else:
        who = "no live worker is registered"
    return (
        f"no live worker serves queue {job.queue!r} ({who}): job {job.id} waits until one "
        f"does (jobkeeper worker --app ... --queue {job.queue})"
    )


def _warn(message: str) -> None:
    # No markup: the message quotes the user's names.
    err_console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


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
@click.option(
    "--queue",
    default=None,
    help="Queue (default: with --app the task's, else default).",
)
@click.option("--delay", type=DECIMAL_NUMBER, default=None, help="Seconds from now, >= 0.")
@click.option(
    "--run-at",
    default=None,
    help="Not before this time: ISO 8601 with its offset, e.g. 2026-12-24T09:00:00+01:00 "
    "or ...Z (not with --delay).",
)
@click.option(
    "--priority",
    type=WHOLE_NUMBER,
    default=None,
    help="Lower runs first (default: with --app the task's, else 0).",
)
@click.option(
    "--max-attempts",
    type=COUNT,
    default=None,
    help="Attempts before dead (default: with --app the task's, else 20).",
)
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

    Warns on stderr, the job enqueued all the same (exit 0): without --app,
    that the task's own queue, priority and max_attempts are unknown and
    which defaults were used; with or without it, when no live worker
    serves the job's queue.
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
    # After the id (stdout stays the id alone, for scripts): the job is
    # stored whatever these say, and the command exits 0.
    if app_spec is None:
        unknown = defaults_warning(task, queue, priority, max_attempts)
        if unknown is not None:
            _warn(unknown)
    try:
        unserved = unserved_warning(jq, job)
    except JobkeeperError as exc:
        unserved = f"job {job.id} is stored, but the live workers could not be read: {exc}"
    if unserved is not None:
        _warn(unserved)
