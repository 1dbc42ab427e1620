"""The ``jobkeeper`` command (Click, Rich).

Exit codes: 0 ok; 2 usage or bad input (one line on stderr naming the
problem; nothing written); 1 anything else (database unavailable, job not
found, a job in the wrong state).

Each command group lives in its own module of this package; this one is the
root group, which adds them in the order the command list shows, and the
console script's entry point, which turns errors into one line and an exit code.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import NoReturn

import click

from jobkeeper.cli import common, streams
from jobkeeper.cli.common import BadInput, Group
from jobkeeper.cli.loading import AppImportFailed
from jobkeeper.errors import (
    ConfigError,
    JobkeeperError,
    PayloadError,
    QueueFull,
)
from jobkeeper.version import __version__

#: Each command and the module:attribute defining it, in the order the command
#: list shows them (Click would sort them by name). A command's module is
#: imported when the command runs or the list is shown: `jobkeeper worker`
#: then starts without Rich's tables or verify's checker (40-50 ms of imports,
#: a tenth of a worker's start-up).
COMMANDS = {
    "migrate": "admin:migrate",
    "worker": "worker:worker",
    "enqueue": "enqueue:enqueue",
    "status": "admin:status",
    "retry": "actions:retry",
    "cancel": "actions:cancel",
    "dashboard": "admin:dashboard",
    "doctor": "admin:doctor",
    "demo": "admin:demo",
    "verify": "verify:verify",
    "jobs": "jobs:jobs_app",
    "dead": "dead:dead_app",
    "periodic": "periodic:periodic_app",
    "queues": "queues:queues_app",
}


class LazyGroup(Group):
    """The root group: commands are loaded from :data:`COMMANDS` on first use
    (Click's "lazily loading subcommands" pattern).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            # Click (8.4+) suggests close names from ``self.commands``, which
            # a lazy group leaves empty: suggest from COMMANDS instead.
            no_such = getattr(click.exceptions, "NoSuchCommand", None)
            if no_such is None or not isinstance(exc, no_such):
                raise
            raise no_such(exc.command_name, possibilities=list(COMMANDS), ctx=ctx) from None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module_name, attribute = where.split(":")
        module = importlib.import_module(f"jobkeeper.cli.{module_name}")
        command: click.Command = getattr(module, attribute)
        return command


@click.group(
    cls=LazyGroup,
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
    help="Database URL (sqlite:///path.db or postgresql://user@host/db). Given, it wins "
    "over everything, the --app's JobQueue included (the app is pointed at it). Else: for "
    "a command given --app, the URL of the app's JobQueue (its argument, else "
    "$JOBKEEPER_DATABASE_URL: what the app's own code uses); for the others "
    "$JOBKEEPER_DATABASE_URL; else sqlite:///jobkeeper.db (demo: a fresh "
    "./jobkeeper-demo.db). A command that leaves a set $JOBKEEPER_DATABASE_URL unused says "
    "so on stderr.",
)
def app(database: str | None) -> None:
    """A durable background job queue on PostgreSQL or SQLite."""


def _fail(message: str, code: int) -> NoReturn:
    # No markup: messages quote the user's input, and "[/]" in it crashed Rich.
    common.err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)


#: The field an API check's message opens with (``max_attempts must ...``,
#: ``delay=...``, ``rate_limit '0/s': ...``).
_FIELD_OPENING = re.compile(r"([a-z]+(?:_[a-z]+)*)(?= must |=| ')")


def _in_option_terms(message: str, argv: list[str]) -> str:
    """An API check's message about a value the command line gave, naming
    the option (``--max-attempts must ...``) rather than the API's field.
    """
    opening = _FIELD_OPENING.match(message)
    if opening is None:
        return message
    option = "--" + opening.group(1).replace("_", "-")
    if any(arg == option or arg.startswith(option + "=") for arg in argv):
        # The API's None is the option left out.
        rest = message[opening.end() :].replace(" (or None)", "").replace(" or None", "")
        return option + rest
    return message


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jobkeeper`` console script."""
    # Before any output: a job's text on a stdout that cannot encode it
    # raised after the command had acted (enqueue --json: the job stored).
    streams.escape_unencodable()
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
    except ConfigError as exc:
        message = str(exc).replace("\n", " ")
        _fail(_in_option_terms(message, sys.argv[1:] if argv is None else argv), 2)
    except (BadInput, PayloadError, QueueFull) as exc:
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
