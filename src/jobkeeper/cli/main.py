"""The ``jobkeeper`` command (Click, Rich).

Exit codes: 0 ok; 2 usage or bad input (one line on stderr naming the
problem; nothing written); 1 anything else (database unavailable, job not
found, a job in the wrong state).

Each command group lives in its own module of this package; this one is the
root group, which adds them in the order the command list shows, and the
console script's entry point, which turns errors into one line and an exit code.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from jobkeeper.cli import actions, admin, dead, enqueue, jobs, periodic, queues, verify, worker
from jobkeeper.cli.common import BadInput, Group, err_console
from jobkeeper.cli.loading import AppImportFailed
from jobkeeper.errors import (
    ConfigError,
    JobkeeperError,
    PayloadError,
    QueueFull,
)
from jobkeeper.version import __version__


@click.group(
    cls=Group,
    name="jobkeeper",
    no_args_is_help=True,
    context_settings={"show_default": True},
)
@click.version_option(
    __version__, "--version", prog_name="jobkeeper", message="%(prog)s %(version)s"
)
@click.option(
    "--database",
    default=None,
    show_default=False,
    help="Database URL (sqlite:///path.db or postgresql://user@host/db); "
    "default $JOBKEEPER_DATABASE_URL, else sqlite:///jobkeeper.db.",
)
def app(database: str | None) -> None:
    """A durable background job queue on PostgreSQL or SQLite."""


# In the order the command list shows them (Click would sort them by name).
for _command in (
    admin.migrate,
    worker.worker,
    enqueue.enqueue,
    admin.status,
    actions.retry,
    actions.cancel,
    admin.dashboard,
    admin.doctor,
    admin.demo,
    verify.verify,
    jobs.jobs_app,
    dead.dead_app,
    periodic.periodic_app,
    queues.queues_app,
):
    app.add_command(_command)


def _fail(message: str, code: int) -> NoReturn:
    # No markup: messages quote the user's input, and "[/]" in it crashed Rich.
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jobkeeper`` console script."""
    try:
        # Not standalone: a `ctx.exit(n)` comes back as the return value, and
        # Click's own errors are raised here, to be printed as one line.
        code = app.main(args=argv, standalone_mode=False)
    except click.Abort:
        _fail("aborted", 130)
    except AppImportFailed as exc:
        # The app's traceback (file and line), then the one error line.
        print(exc.traceback_text, file=sys.stderr)
        _fail(str(exc).replace("\n", " "), 2)
    except (BadInput, PayloadError, ConfigError, QueueFull) as exc:
        _fail(str(exc).replace("\n", " "), 2)
    except JobkeeperError as exc:
        _fail(str(exc).replace("\n", " "), 1)
    except click.ClickException as exc:  # usage errors (exit code 2) and the like
        message = exc.format_message().replace("\n", " ").strip()
        if isinstance(exc, click.NoSuchOption) and exc.option_name == "--database":
            # The one option of the group people put after the command.
            message += " --database goes before the command: jobkeeper --database URL COMMAND ..."
        _fail(message, exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
