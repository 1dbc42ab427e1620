"""Shared pieces of the ``jobkeeper`` commands: Click classes that list
arguments with their help, the consoles, ``--json``, bad input (exit 2), and
the JobQueue a command works on.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import re
import signal
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click

from jobkeeper.api import JobQueue
from jobkeeper.config import WHOLE_NUMBER_EXPECTED, parse_whole_number
from jobkeeper.models import MAX_JOB_ID

if TYPE_CHECKING:
    from rich.console import Console


class Argument(click.Argument):
    """A positional argument with a help text, which ``Command`` lists: Click
    before 8.5 takes no ``help`` for arguments (the text is kept under another
    name so that 8.5's own section does not list it a second time).
    """

    def __init__(self, param_decls: Sequence[str], *, doc: str, **attrs: Any) -> None:
        super().__init__(param_decls, **attrs)
        self.doc = doc


def _summary(help_text: str | None) -> str:
    """The first paragraph of a help text, on one line."""
    return " ".join(inspect.cleandoc(help_text or "").split("\n\n")[0].split())


class _WholeSummary:
    """In the command list, a command's or group's whole first paragraph."""

    help: str | None

    def get_short_help_str(self, limit: int = 45) -> str:
        # Click cuts the summary at `limit` columns with "..."; the command
        # list shows the whole first paragraph instead (wrapped), as before.
        return _summary(self.help)


class Command(_WholeSummary, click.Command):
    """Lists its arguments with their help, before the options."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (
                " ".join(param.get_usage_pieces(ctx)),
                f"{param.doc}  [required]" if param.required else param.doc,
            )
            for param in self.get_params(ctx)
            if isinstance(param, Argument)
        ]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)
        super().format_options(ctx, formatter)


class Group(_WholeSummary, click.Group):
    command_class = Command

    def list_commands(self, ctx: click.Context) -> list[str]:
        # In the order they are defined here (Click sorts them by name).
        return list(self.commands)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # A group run without a command prints its help (to stdout) and then
        # fails with exit code 2, on every Click version: 8.1 exits 0 after
        # the help, 8.2+ raises the whole help as the error message.
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            raise click.UsageError("missing command (see the usage above)", ctx)
        return super().parse_args(ctx, args)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block, as Ctrl-C does:
    the commands that start worker processes (``demo``, ``verify``) then stop
    them and clean up in their ``finally``, instead of dying at once and
    leaving them behind (one perhaps SIGSTOPped for good).
    """

    def interrupt(signum: int, frame: Any) -> None:
        # Once: a second SIGTERM must not cut the clean-up short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave the signal alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: For commands taking job ids: a mistyped ``-1`` reaches the id check (and
#: its message) instead of failing as "No such option: -1".
IDS_MAY_LOOK_LIKE_OPTIONS: dict[str, Any] = {"ignore_unknown_options": True}


class WholeNumber(click.types.IntParamType):
    """An integer as :func:`~jobkeeper.config.parse_whole_number` reads it:
    click.INT (``int()``) also takes ``' 1'``, ``'1_0'`` and other scripts'
    digits, which a job id or a count typed by mistake should not be.

    Args:
        noun: what the value is, for the error (``"a job id"``).
        expected: the error's hint. Only a type whose values may be negative
            mentions a minus sign: a hint offering one for a job id read as
            if ``-`` were part of the syntax (a break-test).
    """

    name = "integer"

    def __init__(self, noun: str = "a whole number", expected: str = WHOLE_NUMBER_EXPECTED):
        self.noun = noun
        self.expected = expected

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_whole_number(str(value), noun=self.noun, expected=self.expected)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class PortNumber(WholeNumber):
    """A TCP port, ``low`` to 65535, in ASCII digits."""

    def __init__(self, low: int) -> None:
        super().__init__("a port number", f"expected a whole number from {low} to 65535")
        self.low = low

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        port = super().convert(value, param, ctx)
        if not self.low <= port <= 65535:
            self.fail(f"{port} is not a port number ({self.low} to 65535)", param, ctx)
        return port


class JobId(WholeNumber):
    """A job id: a whole number from 1 to BIGINT's largest. Refused here,
    ``--after -5`` named its option; the API's check did not.
    """

    def __init__(self) -> None:
        super().__init__("a job id", "expected a whole number from 1 up, e.g. 42")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        number = super().convert(value, param, ctx)
        if not 1 <= number <= MAX_JOB_ID:
            self.fail(f"{str(value)!r} is not {self.noun}: {self.expected}", param, ctx)
        return number


class DecimalNumber(click.types.FloatParamType):
    """A number of seconds or minutes in ASCII: digits, an optional ``-``,
    fraction and exponent. click.FLOAT (``float()``) also takes other
    scripts' digits, ``_`` and spaces.

    A number typed without a fraction or exponent is an int, so that the
    messages quoting it (most come from the API's checks, which take ints
    and floats alike) say ``-5`` as it was typed, not ``-5.0``; one past
    float's range (``1e400``) is refused here, quoting what was typed, rather
    than reported later as ``inf``.
    """

    name = "number"
    _TEXT = re.compile(r"-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool):
            return value
        text = str(value)
        if not self._TEXT.fullmatch(text):
            self.fail(f"{text!r} is not a number (ASCII digits, e.g. 2.5)", param, ctx)
        if text.removeprefix("-").isdigit():
            try:
                return parse_whole_number(text)
            except ValueError as exc:  # over MAX_DIGITS digits
                self.fail(str(exc), param, ctx)
        number = float(text)
        if not math.isfinite(number):
            self.fail(f"{text!r} is out of range", param, ctx)
        return number


#: ``type=`` for the integers that may be negative (``--priority``).
WHOLE_NUMBER = WholeNumber()
#: ``type=`` for counts and limits (``--limit``, ``--concurrency``...).
COUNT = WholeNumber(expected="expected digits 0-9, e.g. 10")
#: ``type=`` for job ids (and dead letters', which are their jobs' ids).
JOB_ID = JobId()
#: ``type=`` for every non-integer number of the CLI.
DECIMAL_NUMBER = DecimalNumber()

json_option = click.option("--json", "as_json", is_flag=True, help="Stable JSON output.")
job_id_argument = click.argument("job_id", cls=Argument, type=JOB_ID, doc="The job id.")


#: Width of tables written to a pipe or file: Rich's default there is 80
#: columns, which cut cells short ("schedu…") in `jobs list > file`.
PIPED_WIDTH = 200


def _console(*, stderr: bool = False) -> Console:
    """A console; one writing to a pipe or file (without COLUMNS set) is wide."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=PIPED_WIDTH)
    return console


_consoles: dict[str, Console] = {}


def __getattr__(name: str) -> Console:
    # ``console`` and ``err_console``, made on first use: importing Rich took
    # a quarter of the CLI's imports, which `jobkeeper worker` never prints with.
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = _consoles.get(name)
    if made is None:
        made = _consoles[name] = _console(stderr=name == "err_console")
    return made


class BadInput(Exception):  # noqa: N818 - reads as what it is
    """Raised by CLI parsing helpers: exit code 2 with this message."""


#: The option of the commands that ask before a bulk action.
yes_option = click.option("--yes", "-y", is_flag=True, help="Act without asking for confirmation.")


def confirm(question: str, action: str) -> None:
    """Ask ``question`` on the terminal; return on yes.

    Raises:
        click.Abort: answered no, or Ctrl-C (exit 130).
        BadInput: stdin ended with no answer (a script, a pipe): says to
            pass ``--yes`` to ``action`` without asking (exit 2).
    """
    try:
        confirmed = click.confirm(question)
    except click.Abort as exc:
        # End of input, not Ctrl-C: a script or a pipe with no answer in it.
        if isinstance(exc.__context__, EOFError):
            raise BadInput(
                f"{question} no answer on stdin: pass --yes to {action} without asking"
            ) from None
        raise
    if not confirmed:
        raise click.Abort


def open_queue(ctx: click.Context) -> JobQueue:
    """The JobQueue for ``--database`` (else $JOBKEEPER_DATABASE_URL, else the default)."""
    url: str | None = ctx.find_root().params.get("database")
    jq = JobQueue(url)
    # Close its connections (PostgreSQL: a pool with threads) when the command ends.
    ctx.call_on_close(jq.close)
    return jq
