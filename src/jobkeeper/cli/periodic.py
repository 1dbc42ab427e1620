"""``jobkeeper periodic list|prune``: the stored periodic jobs."""

from __future__ import annotations

import click

from jobkeeper.cli import render
from jobkeeper.cli.common import (
    DECIMAL_NUMBER,
    Group,
    console,
    json_option,
    open_queue,
)

periodic_app = Group(
    "periodic", help="Inspect and prune the stored periodic jobs.", no_args_is_help=True
)


_stale_after_option = click.option(
    "--stale-after",
    type=DECIMAL_NUMBER,
    default=None,
    show_default=False,
    help="Seconds without a pass of a worker registering a periodic before it counts "
    "as stale (default: rescue_after, 60).",
)


@periodic_app.command("list")
@_stale_after_option
@json_option
@click.pass_context
def periodic_list(ctx: click.Context, stale_after: float | None, as_json: bool) -> None:
    """List the stored periodic jobs; stale ones are registered by no running
    worker, overdue ones have a past next tick that no worker fired.
    """
    jq = open_queue(ctx)
    rows = jq.periodic_list(stale_after=stale_after)
    now = jq.backend.db_now()
    if as_json:
        # overdue as the table's state says it (it needs the database clock).
        render.print_json(console, [{**row.to_dict(), "overdue": row.overdue(now)} for row in rows])
    else:
        console.print(render.periodic_table(rows, now=now))


@periodic_app.command("prune")
@_stale_after_option
@json_option
@click.pass_context
def periodic_prune(ctx: click.Context, stale_after: float | None, as_json: bool) -> None:
    """Delete the stale periodic jobs (no running worker registers them)."""
    names = open_queue(ctx).periodic_prune(stale_after=stale_after)
    if as_json:
        render.print_json(console, {"pruned": names})
        return
    noun = "periodic" if len(names) == 1 else "periodics"
    shown = f": {' '.join(names)}" if names else ""
    console.print(f"pruned {len(names)} stale {noun}{shown}", markup=False, highlight=False)
