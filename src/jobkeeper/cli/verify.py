"""``jobkeeper verify``: the chaos check against the user's own database, and
its verdict.
"""

from __future__ import annotations

import os

import click
from rich.table import Table

from jobkeeper.cli.common import (
    DECIMAL_NUMBER,
    BadInput,
    Command,
    console,
    err_console,
    terminate_as_interrupt,
)
from jobkeeper.database_url import DATABASE_URL_ENV
from jobkeeper.errors import ConfigError
from jobkeeper.verify import run as verify_run

#: Violations listed under the verdict (the rest are counted).
SHOWN = 20
FAULT_NAMES = {
    "kill": "SIGKILL + restart",
    "stop": "SIGSTOP past rescue_after + SIGCONT",
    "restart": "graceful stop + restart",
}


def _minutes(value: float) -> float:
    if not 0 < value <= 24 * 60:
        raise BadInput(f"--minutes must be more than 0 and at most 1440, got {value!r}")
    return value


def verdict_table(verdict: verify_run.Verdict) -> Table:
    """The figures of a run, one row each."""
    s = verdict.report.stats
    c = verdict.config
    table = Table(
        title=f"jobkeeper verify: {verdict.backend}, run {verdict.run}", show_header=False
    )
    table.add_column(style="bold")
    table.add_column()
    by_status = ", ".join(f"{k} {v}" for k, v in s["by_status"].items()) or "none"
    faults = ", ".join(f"{FAULT_NAMES.get(k, k)} {v}" for k, v in sorted(verdict.faults.items()))
    table.add_row("jobs", f"{s['jobs']} enqueued; {by_status}")
    table.add_row("workers", f"{c.workers} x {c.concurrency}, {verdict.worker_starts} starts")
    table.add_row("faults", faults or "none")
    table.add_row(
        "rescues",
        f"{s['rescues']} (heartbeat {c.heartbeat_interval:g}s, rescue_after {c.rescue_after:g}s)",
    )
    table.add_row(
        "overlaps",
        f"{s['overlaps']} (must be 0); {s['overlaps_justified']} after a holder was "
        "silent past rescue_after",
    )
    table.add_row("lost", f"{s['lost']} (must be 0)")
    table.add_row("executions", f"{s['executions']}, {s['cut_short']} cut short by a fault")
    table.add_row("time", f"{verdict.elapsed:.0f}s")
    return table


@click.command("verify", cls=Command)
@click.option(
    "--minutes",
    type=DECIMAL_NUMBER,
    default=1.0,
    help="Length of the fault phase (fractions allowed); the drain and checks follow.",
)
@click.pass_context
def verify(ctx: click.Context, minutes: float) -> None:
    """Chaos-check the database: start workers on a queue of its own, enqueue
    jobs while SIGKILLing, pausing and restarting them, then check the whole
    history (none lost, no overlapping live executions, no acks by non-holders)
    and remove everything it wrote. Exit 0 on a pass, 1 on a failed check, 2
    when the database is unreachable or not migrated.
    """
    url = ctx.find_root().params.get("database")
    source = ""
    if url is None:
        url = os.environ.get(DATABASE_URL_ENV)
        source = f" (from ${DATABASE_URL_ENV})"
    if not url:
        raise BadInput(f"verify needs --database URL (or ${DATABASE_URL_ENV})")
    seconds = _minutes(minutes) * 60
    try:
        verify_run.preflight(url)
    except (verify_run.BadInput, ConfigError) as exc:
        raise BadInput(f"{exc}{source}") from None
    config = verify_run.VerifyConfig(url=url, seconds=seconds)

    def say(line: str) -> None:
        err_console.print(line, markup=False, highlight=False)

    with terminate_as_interrupt():
        verdict = verify_run.run_verify(config, say=say)
    console.print(verdict_table(verdict))
    for violation in verdict.report.violations[:SHOWN]:
        console.print(f"  {violation}", markup=False, highlight=False)
    hidden = len(verdict.report.violations) - SHOWN
    if hidden > 0:
        console.print(f"  ... and {hidden} more violations", highlight=False)
    for failure in verdict.failures:
        console.print(f"  - {failure}", markup=False, highlight=False)
    if verdict.passed:
        console.print("[bold green]PASS[/]: every job accounted for, no overlap, no lost job")
    else:
        problems = len(verdict.report.violations) + len(verdict.failures)
        console.print(f"[bold red]FAIL[/]: {problems} problems")
    ctx.exit(0 if verdict.passed else 1)
