"""Importing the user's app (``--app package.module:attribute``)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Callable

import click

from jobkeeper.api import JobQueue
from jobkeeper.backends import resolve_database_url
from jobkeeper.cli import common
from jobkeeper.cli.common import (
    BadInput,
)
from jobkeeper.database_url import DATABASE_URL_ENV, redact_secrets
from jobkeeper.errors import ConfigError, DatabaseError, JobkeeperError


class AppImportFailed(BadInput):
    """The app's module raised while imported: exit 2, its traceback shown
    above the one-line error.
    """

    def __init__(self, message: str, *, traceback_text: str) -> None:
        super().__init__(message)
        self.traceback_text = traceback_text


def _names_app_module(exc: ModuleNotFoundError, module_name: str) -> bool:
    """Whether the missing module is the app's module or one of its parents."""
    missing = exc.name or ""
    return module_name == missing or module_name.startswith(missing + ".")


def _app_traceback(exc: BaseException) -> str:
    """``exc``'s traceback without the frames of the import machinery and of
    this module: what is left is the app's own code (file and line).
    """
    machinery = {os.path.abspath(__file__), os.path.abspath(importlib.__file__ or "")}
    report = traceback.TracebackException.from_exception(exc)
    report.stack = traceback.StackSummary.from_list(
        [
            frame
            for frame in report.stack
            if not frame.filename.startswith("<frozen importlib")
            and os.path.abspath(frame.filename) not in machinery
        ]
    )
    return "".join(report.format()).rstrip("\n")


def _app_frame(exc: BaseException) -> str | None:
    """``file:line`` of the deepest frame of ``exc`` outside jobkeeper and
    the import machinery (and generated code, "<string>"): the app's line
    that called into jobkeeper.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # jobkeeper's own context managers run in contextlib's frames: those are
    # not the app's line either.
    skipped = {os.path.abspath(module.__file__ or "") for module in (importlib, contextlib)}
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if frame.filename.startswith("<") or path.startswith(package + os.sep):
            continue
        if path in skipped:
            continue
        found = f"{frame.filename}:{frame.lineno}"
    return found


def print_warning(message: str) -> None:
    """``warning: message`` on stderr, one line (no markup: it quotes URLs)."""
    common.err_console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


def unused_environment_warning(spec: str, environment: str | None, jq: JobQueue) -> str | None:
    """What a command given ``--app`` (and no ``--database``) says when the
    app's JobQueue names a database other than ``$JOBKEEPER_DATABASE_URL``
    (``environment``, as it was before the import): the app's wins, as in
    the app's own code, while the commands without ``--app`` use the
    variable's. Both URLs are shown with their passwords masked. None when
    the variable is unset or empty, or names the app's database.
    """
    if not environment:
        return None
    try:
        named = resolve_database_url(environment)
    except ConfigError:  # not a URL the app could have used: it is unused all the same
        shown = redact_secrets(environment.strip())
    else:
        if named.url == jq.url.url:
            return None
        shown = named.redacted()
    return (
        f"${DATABASE_URL_ENV} ({shown}) is not used: --app {spec}'s JobQueue names its own "
        f"database, {jq.url.redacted()}, which commands given --app use; commands without "
        f"--app (jobs, status, dashboard ...) use ${DATABASE_URL_ENV}. Pass --database URL "
        "to name one database for every command"
    )


def load_app(
    spec: str, database_url: str | None, *, warn: Callable[[str], None] = print_warning
) -> JobQueue:
    """Import the app's JobQueue, on ``database_url`` when one is given.

    ``--database`` is put in ``JOBKEEPER_DATABASE_URL`` before the import (so
    an app that uses the database at import time already uses that one), and
    the app's queue is then pointed at it in place: its tasks, and the
    follow-up jobs they enqueue, use that database too. Without it the
    app's queue keeps its own URL (its ``JobQueue(url)``, else the
    variable's): when that is not the variable's, ``warn`` is called with
    :func:`unused_environment_warning`'s message.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise BadInput(f"--app {spec!r}: expected package.module:attribute, e.g. myapp.jobs:jq")
    # `--database ''` is refused here as by every other command, not ignored.
    wanted = resolve_database_url(database_url) if database_url is not None else None
    environment = os.environ.get(DATABASE_URL_ENV)
    if wanted is not None:
        os.environ[DATABASE_URL_ENV] = wanted.url
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # any error of the app itself (re-raised: Ctrl-C)
        if isinstance(exc, KeyboardInterrupt):
            raise
        if isinstance(exc, ModuleNotFoundError) and _names_app_module(exc, module_name):
            # The app's module itself is not there: one line says it all.
            raise BadInput(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from None
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, DatabaseError):
            # The app used the database at import (a migrate() at module
            # level) and the database failed: a database error (exit 1, as
            # for any command), saying where, not bad input.
            where = _app_frame(exc)
            raise type(exc)(
                f"importing app {spec!r} failed: {exc}" + (f" (at {where})" if where else "")
            ) from None
        if isinstance(exc, JobkeeperError):
            # jobkeeper refused the app's own setup (a bad JobQueue setting, a
            # bad task option): its message says what; one line says where.
            where = _app_frame(exc)
            raise BadInput(
                f"importing app {spec!r} failed: {detail}" + (f" (at {where})" if where else "")
            ) from None
        # The app's own code raised while being imported (a bug at module
        # level, a SyntaxError, an import of a missing dependency, a
        # sys.exit()): where it happened matters, so its traceback is shown.
        raise AppImportFailed(
            f"importing app {spec!r} failed: {detail}", traceback_text=_app_traceback(exc)
        ) from None
    jq = getattr(module, attribute, None)
    if not isinstance(jq, JobQueue):
        raise BadInput(
            f"--app {spec!r}: {module_name}.{attribute} is "
            f"{type(jq).__name__ if jq is not None else 'missing'}, not a JobQueue"
        )
    if wanted is not None:
        if jq.url.url != wanted.url:
            jq.use_database(wanted.url)
    else:
        unused = unused_environment_warning(spec, environment, jq)
        if unused is not None:
            warn(unused)
    return jq


def open_app_queue(ctx: click.Context, spec: str) -> JobQueue:
    """:func:`load_app` for a command: on the root's ``--database``, closed
    when the command ends (as :func:`~jobkeeper.cli.common.open_queue`).
    """
    jq = load_app(spec, ctx.find_root().params.get("database"))
    ctx.call_on_close(jq.close)
    return jq
