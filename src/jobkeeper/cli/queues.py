"""``jobkeeper queues list|pause|resume|set``: flow control across all workers."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import click

from jobkeeper import JobQueue
from jobkeeper.cli import render
from jobkeeper.cli.common import (
    Argument,
    BadInput,
    Group,
    console,
    json_option,
    open_queue,
)
from jobkeeper.config import check_name, parse_whole_number
from jobkeeper.errors import ConfigError
from jobkeeper.queues import (
    MAX_LIMIT,
    MAX_PENDING_LIMIT,
    UNSET,
    QueueInfo,
    Unset,
    check_concurrency,
    check_max_pending,
)

queues_app = Group(
    "queues",
    help="Flow control: pause, resume and limit queues across all workers.",
    no_args_is_help=True,
)


_queue_argument = click.argument("name", cls=Argument, doc="The queue's name.")


def _known(queue: JobQueue, name: str) -> QueueInfo | None:
    """The queue as ``queues list`` shows it, or None: no setting, live job,
    dead letter or recent finished job names it (nothing counts every row).
    """
    return next((info for info in queue.queues(recount=False) if info.name == name), None)


@queues_app.command("list")
@json_option
@click.pass_context
def queues_list(ctx: click.Context, as_json: bool) -> None:
    """Every queue with settings or jobs: paused or not, its limits, its live
    counts. --json adds its completed, cancelled and dead counts: exact up to
    100,000 rows, past that counted for this command (every row: 0.2-0.8 s
    per 2 million on PostgreSQL) and named in "estimated", and in "lower_bound"
    while that count fails (see JobQueue.queues).
    The table counts no finished row: past 100,000 of them, a queue with only
    older finished jobs is left out of it.
    """
    # The table shows live counts only: it need not count the finished rows.
    queues = open_queue(ctx).queues(recount=as_json)
    if as_json:
        render.print_json(console, [queue.as_dict() for queue in queues])
    else:
        console.print(render.queues_table(queues))


@queues_app.command("pause")
@_queue_argument
@click.pass_context
def queues_pause(ctx: click.Context, name: str) -> None:
    """Stop every worker from starting jobs of the queue (running jobs finish)."""
    queue = open_queue(ctx)
    known = _known(queue, name)
    with _warned_once():
        queue.pause(name)
    note = ""
    if not known:
        note = " (no setting, live job or recent job named it yet: the pause holds for its jobs)"
    console.print(f"queue {name} paused{note}", markup=False, highlight=False)


@queues_app.command("resume")
@_queue_argument
@click.pass_context
def queues_resume(ctx: click.Context, name: str) -> None:
    """Let workers start jobs of the queue again."""
    queue = open_queue(ctx)
    check_name("queue", name)
    before = _known(queue, name)
    if before is None or not before.paused:
        # Nothing to write: a resume must not create settings for a typo.
        what = (
            "no setting, live job or recent job names it" if before is None else "it was not paused"
        )
        console.print(
            f"queue {name} not paused ({what}): nothing to resume", markup=False, highlight=False
        )
        return
    with _warned_once():
        queue.resume(name)
    console.print(f"queue {name} resumed", markup=False, highlight=False)


def _int_or_none(
    option: str,
    text: str | None,
    check: Callable[[int], int],
    lowest: int,
    highest: int,
    hint: str = "",
) -> int | Unset | None:
    """An option's limit: UNSET when not given, None for 'none', else an
    int that ``check`` (the API's own) accepts; refused in the option's
    terms ('none', not the API's None).
    """
    if text is None:
        return UNSET
    if text.strip().lower() == "none":
        return None
    expected = f"expected a whole number from {lowest} to {highest}{hint}, or 'none'"
    try:
        return check(parse_whole_number(text))
    except (ValueError, ConfigError):
        raise BadInput(f"{option} {text!r}: {expected}") from None


@queues_app.command("set")
@_queue_argument
@click.option(
    "--concurrency", default=None, help="Most jobs held at once, all workers ('none' lifts it)."
)
@click.option(
    "--rate-limit",
    default=None,
    help="Most claims per period: N/s, N/m or N/h ('none' lifts it).",
)
@click.option(
    "--max-pending",
    default=None,
    help="Most pending jobs before enqueues are refused ('none' lifts it).",
)
@click.pass_context
def queues_set(
    ctx: click.Context,
    name: str,
    concurrency: str | None,
    rate_limit: str | None,
    max_pending: str | None,
) -> None:
    """Set the queue's limits; only the options given change."""
    try:
        check_name("queue", name)
    except ConfigError as exc:
        raise BadInput(f"queues set: {exc}") from None
    if concurrency is None and rate_limit is None and max_pending is None:
        raise BadInput("queues set: give --concurrency, --rate-limit or --max-pending")
    rate: str | Unset | None = UNSET
    if rate_limit is not None:
        rate = None if rate_limit.strip().lower() == "none" else rate_limit
    with _warned_once():
        info = open_queue(ctx).configure_queue(
            name,
            concurrency=_int_or_none(
                "--concurrency",
                concurrency,
                check_concurrency,
                1,
                MAX_LIMIT,
                " (pause the queue to stop it)",
            ),
            rate_limit=rate,
            max_pending=_int_or_none(
                "--max-pending", max_pending, check_max_pending, 0, MAX_PENDING_LIMIT
            ),
        )
    shown = ", ".join(
        f"{key}={'none' if value is None else value}"
        for key, value in (
            ("concurrency", info.concurrency),
            ("rate_limit", info.rate_limit),
            ("max_pending", info.max_pending),
        )
    )
    console.print(f"queue {name}: {shown}", markup=False, highlight=False)


@contextlib.contextmanager
def _warned_once() -> Iterator[None]:
    """A queue change that older workers will ignore is logged (one line on
    stderr) and warned (``warnings``) for API callers: here, only logged.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield
