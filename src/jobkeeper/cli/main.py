"""The ``jobkeeper`` command (Click, Rich).

Exit codes: 0 ok; 2 usage or bad input (one line on stderr naming the
problem; nothing written); 1 anything else (database unavailable, job not
found, a job in the wrong state).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from rich.console import Console

from jobkeeper.api import JobQueue
from jobkeeper.backends import resolve_database_url
from jobkeeper.cli import render
from jobkeeper.config import DATABASE_URL_ENV
from jobkeeper.errors import (
    ConfigError,
    JobkeeperError,
    PayloadError,
    QueueFull,
)
from jobkeeper.joblog import JsonFormatter
from jobkeeper.models import HELD_STATUSES, JobStatus
from jobkeeper.payload import child_path
from jobkeeper.queues import UNSET, Unset, parse_queue_share
from jobkeeper.version import __version__


class _Argument(click.Argument):
    """A positional argument with a help text, which ``_Command`` lists: Click
    before 8.5 takes no ``help`` for arguments (the text is kept under another
    name so that 8.5's own section does not list it a second time).
    """

    def __init__(self, param_decls: Sequence[str], *, doc: str, **attrs: Any) -> None:
        super().__init__(param_decls, **attrs)
        self.doc = doc


def _summary(help_text: str | None) -> str:
    """The first paragraph of a help text, on one line."""
    return " ".join(inspect.cleandoc(help_text or "").split("\n\n")[0].split())


class _Command(click.Command):
    """Lists its arguments with their help, before the options."""

    def get_short_help_str(self, limit: int = 45) -> str:
        # Click cuts the summary at `limit` columns with "..."; the command
        # list shows the whole first paragraph instead (wrapped), as before.
        return _summary(self.help)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (
                " ".join(param.get_usage_pieces(ctx)),
                f"{param.doc}  [required]" if param.required else param.doc,
            )
            for param in self.get_params(ctx)
            if isinstance(param, _Argument)
        ]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)
        super().format_options(ctx, formatter)


class _Group(click.Group):
    command_class = _Command

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


@click.group(
    cls=_Group,
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


jobs_app = _Group("jobs", help="Inspect jobs.", no_args_is_help=True)
dead_app = _Group("dead", help="Inspect and requeue dead letters.", no_args_is_help=True)
periodic_app = _Group(
    "periodic", help="Inspect and prune the stored periodic jobs.", no_args_is_help=True
)
queues_app = _Group(
    "queues",
    help="Flow control: pause, resume and limit queues across all workers.",
    no_args_is_help=True,
)
#: For commands taking job ids: a mistyped ``-1`` reaches the id check (and
#: its message) instead of failing as "No such option: -1".
_IDS_MAY_LOOK_LIKE_OPTIONS: dict[str, Any] = {"ignore_unknown_options": True}

_json_option = click.option("--json", "as_json", is_flag=True, help="Stable JSON output.")
_job_id_argument = click.argument("job_id", cls=_Argument, type=click.INT, doc="The job id.")

#: Width of tables written to a pipe or file: Rich's default there is 80
#: columns, which cut cells short ("schedu…") in `jobs list > file`.
PIPED_WIDTH = 200


def _console(*, stderr: bool = False) -> Console:
    """A console; one writing to a pipe or file (without COLUMNS set) is wide."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=PIPED_WIDTH)
    return console


console = _console()
err_console = _console(stderr=True)


class BadInput(Exception):  # noqa: N818 - reads as what it is
    """Raised by CLI parsing helpers: exit code 2 with this message."""


def _queue(ctx: click.Context) -> JobQueue:
    """The JobQueue for ``--database`` (else $JOBKEEPER_DATABASE_URL, else the default)."""
    url: str | None = ctx.find_root().params.get("database")
    jq = JobQueue(url)
    # Close its connections (PostgreSQL: a pool with threads) when the command ends.
    ctx.call_on_close(jq.close)
    return jq


@app.command("migrate")
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade the schema (idempotent; safe to run concurrently)."""
    jq = _queue(ctx)
    version = jq.migrate()
    # No markup: the URL is the user's text ("[/]" in it crashed Rich).
    console.print(
        f"schema at version {version} on {jq.url.redacted()}", markup=False, highlight=False
    )


def _load_app(spec: str, database_url: str | None) -> JobQueue:
    """Import the app's JobQueue, on ``database_url`` when one is given.

    ``--database`` is put in ``JOBKEEPER_DATABASE_URL`` before the import (so
    an app that uses the database at import time already uses that one), and
    the app's queue is then pointed at it in place: its tasks, and the
    follow-up jobs they enqueue, use that database too.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise BadInput(f"--app {spec!r}: expected package.module:attribute, e.g. myapp.jobs:jq")
    # `--database ''` is refused here as by every other command, not ignored.
    wanted = resolve_database_url(database_url) if database_url is not None else None
    if wanted is not None:
        os.environ[DATABASE_URL_ENV] = wanted.url
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from None
    except BaseException as exc:  # any error of the app itself (re-raised: Ctrl-C)
        # The app's own code raised while being imported (a bug at module
        # level, a SyntaxError, a sys.exit(), its own BaseException subclass):
        # one line, not a traceback. Ctrl-C stays Ctrl-C.
        if isinstance(exc, KeyboardInterrupt):
            raise
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise BadInput(f"importing app {spec!r} failed: {detail}") from None
    jq = getattr(module, attribute, None)
    if not isinstance(jq, JobQueue):
        raise BadInput(
            f"--app {spec!r}: {module_name}.{attribute} is "
            f"{type(jq).__name__ if jq is not None else 'missing'}, not a JobQueue"
        )
    if wanted is not None and jq.url.url != wanted.url:
        jq.use_database(wanted.url)
    return jq


@app.command("worker")
@click.option(
    "--app",
    "app_spec",
    required=True,
    help="Where your JobQueue lives: package.module:attribute.",
)
@click.option(
    "--queue",
    "-q",
    "queue",
    multiple=True,
    help="Queue to work; repeat for several. QUEUE=N: run at most N of its jobs at once "
    "(within --concurrency). Default: every queue the app's tasks use.",
)
@click.option("--concurrency", type=click.INT, default=10, help="Most jobs running at once.")
@click.option("--burst", is_flag=True, help="Drain the queues, then exit.")
@click.option(
    "--prefetch",
    type=click.INT,
    default=None,
    help="Jobs to claim beyond free slots (default: adaptive).",
)
@click.option("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    help="text, or json: one JSON object a line (time, level, logger, message, job fields).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve this worker's Prometheus metrics at /metrics on this port "
    "(pip install 'jobkeeper[metrics]').",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    help="Address of the metrics port (default 127.0.0.1).",
)
@click.pass_context
def worker(
    ctx: click.Context,
    app_spec: str,
    queue: tuple[str, ...],
    concurrency: int,
    burst: bool,
    prefetch: int | None,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run a worker until SIGTERM/SIGINT (graceful) or, with --burst, until drained."""
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise BadInput(f"--log-level {log_level!r}: use DEBUG, INFO, WARNING or ERROR")
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for text in queue:
        _, share = parse_queue_share(text)
        if share is not None and share > concurrency:
            raise BadInput(
                f"--queue {text!r}: the share {share} is more than --concurrency {concurrency}"
            )
    logging.basicConfig(level=level, handlers=[handler])
    jq = _load_app(app_spec, ctx.find_root().params.get("database"))
    if metrics_port is not None:
        _serve_metrics(jq, metrics_port, metrics_host)
    code = jq.run_worker(
        queues=list(queue) or None, concurrency=concurrency, burst=burst, prefetch=prefetch
    )
    ctx.exit(code)


def _serve_metrics(jq: JobQueue, port: int, host: str) -> None:
    """Count this worker's jobs (an event listener) and serve them on ``host:port``."""
    try:
        from jobkeeper.metrics import WorkerMetrics

        metrics = WorkerMetrics()
    except ImportError as exc:
        raise BadInput(
            f"--metrics-port needs prometheus-client ({exc.name} is missing): "
            "pip install 'jobkeeper[metrics]'"
        ) from None
    try:
        metrics.serve(port, host)
    except OSError as exc:
        raise BadInput(f"--metrics-port {port}: cannot listen on {host}:{port}: {exc}") from None
    jq.on_event(metrics, metrics.kinds)


class _NonJsonConstant:
    """Stands in for a ``NaN``/``Infinity``/``-Infinity`` literal while
    ``--args`` is parsed, so that the error can name where it is
    (``args.a[1].b``), as the API's own check does (sidekiq#3294).
    """

    def __init__(self, name: str) -> None:
        self.name = name


class _TooLongInt:
    """Stands in for a JSON integer past Python's int/str digit limit
    (``sys.get_int_max_str_digits()``) while ``--args`` is parsed, so that the
    error can name where it is instead of repeating Python's advice.
    """

    def __init__(self, digits: int, limit: int) -> None:
        self.digits = digits
        self.limit = limit


def _find_marker(value: Any) -> tuple[str, _TooLongInt | _NonJsonConstant]:
    """The path (``args.a[1].b``) and marker of the first value ``--args``
    cannot hold (a too-long integer, a NaN/Infinity literal).
    """
    # Iterative, in document order: the JSON may be nested deeply.
    stack: list[tuple[Any, str]] = [(value, "args")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _TooLongInt | _NonJsonConstant):
            return path, item
        children: list[tuple[Any, str]] = []
        if isinstance(item, dict):
            children = [(child, child_path(path, key)) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, child_path(path, i)) for i, child in enumerate(item)]
        stack.extend(reversed(children))
    raise AssertionError("a marker was parsed but not found")  # pragma: no cover


def parse_args_json(text: str) -> dict[str, Any]:
    """Parse ``--args``: a JSON object, strictly (no NaN/Infinity, no duplicate keys).

    Raises:
        BadInput: naming the problem.
    """

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise BadInput(f"--args: duplicate key {key!r}")
            seen[key] = value
        return seen

    markers: list[_TooLongInt | _NonJsonConstant] = []

    def parse_constant(name: str) -> _NonJsonConstant:
        marker = _NonJsonConstant(name)
        markers.append(marker)
        return marker

    def parse_int(digits: str) -> int | _TooLongInt:
        limit = sys.get_int_max_str_digits()
        length = len(digits.lstrip("-"))
        if limit and length > limit:
            marker = _TooLongInt(length, limit)
            markers.append(marker)
            return marker
        return int(digits)

    try:
        value = json.loads(
            text,
            parse_constant=parse_constant,
            parse_int=parse_int,
            object_pairs_hook=no_duplicates,
        )
    except json.JSONDecodeError as exc:
        raise BadInput(f"--args is not valid JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit limit
        raise BadInput(f"--args cannot be read: {exc}") from None
    except RecursionError:
        raise BadInput("--args: JSON nested too deeply") from None
    if markers:
        path, marker = _find_marker(value)
        if isinstance(marker, _NonJsonConstant):
            raise BadInput(
                f"--args: {path} is {marker.name}, which is not valid JSON "
                "(NaN and Infinity are refused)"
            )
        raise BadInput(
            f"--args: {path} is an integer of {marker.digits} digits; integers with more "
            f"than {marker.limit} digits are not supported"
        )
    if not isinstance(value, dict):
        raise BadInput(f"--args must be a JSON object, got {type(value).__name__}: {text[:60]}")
    return value


#: How many of an app's task names an unknown-task error lists.
_TASKS_SHOWN = 10


def _check_task_known(jq: JobQueue, task: str, app_spec: str) -> None:
    """With ``--app`` the task must be one of the app's: a typo would otherwise
    enqueue a job no worker of that app can run.

    Raises:
        BadInput: naming the task and (up to ten of) the app's task names.
    """
    if task in jq.tasks:
        return
    names = sorted(jq.tasks)
    if not names:
        known = "it defines no tasks"
    else:
        shown = ", ".join(names[:_TASKS_SHOWN])
        more = f" and {len(names) - _TASKS_SHOWN} more" if len(names) > _TASKS_SHOWN else ""
        known = f"its tasks: {shown}{more}"
    raise BadInput(f"--app {app_spec!r} has no task {task!r}; {known}")


@app.command("enqueue")
@click.argument("task", cls=_Argument, doc="The task's registered name.")
@click.option("--args", default="{}", help="Arguments as a JSON object.")
@click.option(
    "--app",
    "app_spec",
    default=None,
    help="Your JobQueue (package.module:attribute): the task's own queue, "
    "priority and max_attempts apply and its arguments are checked.",
)
@click.option("--queue", default=None, help="Queue (default: default).")
@click.option("--delay", type=click.FLOAT, default=None, help="Seconds from now, >= 0.")
@click.option("--priority", type=click.INT, default=None, help="Lower runs first.")
@click.option("--max-attempts", type=click.INT, default=None, help="Attempts before dead.")
@click.option(
    "--unique-key",
    default=None,
    help="Skip if a job of this task with this key is scheduled, available, claimed, "
    "running or retryable (print that job's id).",
)
@click.pass_context
def enqueue(
    ctx: click.Context,
    task: str,
    args: str,
    app_spec: str | None,
    queue: str | None,
    delay: float | None,
    priority: int | None,
    max_attempts: int | None,
    unique_key: str | None,
) -> None:
    """Enqueue one job and print its id."""
    if delay is not None and not math.isfinite(delay):
        raise BadInput(f"--delay {delay}: must be a finite number of seconds >= 0")
    payload = parse_args_json(args)
    database = ctx.find_root().params.get("database")
    if app_spec is not None:
        jq = _load_app(app_spec, database)
        ctx.call_on_close(jq.close)
        _check_task_known(jq, task, app_spec)
    else:
        jq = _queue(ctx)
    job = jq.enqueue(
        task,
        payload,
        queue=queue,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
        unique_key=unique_key,
    )
    console.print(job.id, highlight=False)


@app.command("status")
@_json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Job counts per queue and status, and the registered workers (a worker
    without a heartbeat for longer than its own rescue_after is marked stale).
    """
    jq = _queue(ctx)
    stats = jq.stats()
    workers = jq.workers()
    # Heartbeats are written with the database clock, so their age is measured
    # against it too (a skewed local clock cannot make a live worker look dead).
    now = jq.backend.db_now()
    rescue_after = jq.settings.rescue_after
    if as_json:
        render.print_json(
            console, render.status_json(stats, workers, now=now, rescue_after=rescue_after)
        )
        return
    console.print(render.status_table(stats))
    console.print(render.workers_table(workers, now=now, rescue_after=rescue_after))


def _status_option(value: str | None) -> JobStatus | None:
    if value is None:
        return None
    try:
        return JobStatus(value)
    except ValueError:
        valid = ", ".join(s.value for s in JobStatus)
        raise BadInput(f"--status {value!r}: use one of {valid}") from None


@jobs_app.command("list")
@click.option(
    "--status",
    default=None,
    help="Only jobs in this status: " + ", ".join(s.value for s in JobStatus) + ".",
)
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("--limit", type=click.INT, default=50, help="At most this many (1-10000).")
@_json_option
@click.pass_context
def jobs_list(
    ctx: click.Context, status: str | None, queue: str | None, limit: int, as_json: bool
) -> None:
    """List jobs, newest first."""
    jobs = _queue(ctx).list_jobs(status=_status_option(status), queue=queue, limit=limit)
    if as_json:
        render.print_json(console, [job.to_dict() for job in jobs])
    else:
        console.print(render.jobs_table(jobs))


@jobs_app.command("show", context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@_job_id_argument
@_json_option
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show one job with its errors and result."""
    job = _queue(ctx).get_job(job_id)
    if job is None:
        err_console.print(f"error: no job with id {job_id}", highlight=False)
        ctx.exit(1)
    if as_json:
        render.print_json(console, job.to_dict())
    else:
        console.print(render.job_detail(job))


@app.command("retry", context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@_job_id_argument
@click.pass_context
def retry(ctx: click.Context, job_id: int) -> None:
    """Run a dead, retryable, cancelled or completed job again now."""
    job = _queue(ctx).retry(job_id)
    console.print(f"job {job.id} is {job.status.value}", highlight=False)


@app.command("cancel", context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@_job_id_argument
@click.pass_context
def cancel(ctx: click.Context, job_id: int) -> None:
    """Cancel a pending job, or ask the worker running it to stop."""
    job = _queue(ctx).cancel(job_id)
    held = job.status in HELD_STATUSES
    note = " (cancel requested; its worker will stop it)" if held else ""
    console.print(f"job {job.id} is {job.status.value}{note}", highlight=False)


@dead_app.command("list")
@click.option("--queue", default=None, help="Only this queue.")
@click.option("--limit", type=click.INT, default=50, help="At most this many (1-10000).")
@_json_option
@click.pass_context
def dead_list(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """List dead letters, newest first."""
    jobs = _queue(ctx).list_jobs(status=JobStatus.DEAD, queue=queue, limit=limit)
    if as_json:
        render.print_json(console, [job.to_dict() for job in jobs])
    else:
        console.print(render.jobs_table(jobs, title="dead letters"))


@dead_app.command("requeue", context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("job_ids", cls=_Argument, type=click.INT, nargs=-1, doc="Dead letter ids.")
@click.option("--all", "all_", is_flag=True, help="Requeue every dead letter.")
@click.pass_context
def dead_requeue(ctx: click.Context, job_ids: tuple[int, ...], all_: bool) -> None:
    """Move dead letters back to the queue, attempts reset."""
    if bool(job_ids) == all_:
        raise BadInput("dead requeue: give job ids or --all (not both)")
    moved = _queue(ctx).requeue_dead(None if all_ else list(job_ids))
    missing = sorted(set(job_ids) - set(moved))
    if moved:
        noun = "job" if len(moved) == 1 else "jobs"
        console.print(f"requeued {len(moved)} {noun}: {' '.join(map(str, moved))}", highlight=False)
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


@dead_app.command("purge", context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("job_ids", cls=_Argument, type=click.INT, nargs=-1, doc="Dead letter ids.")
@click.option("--all", "all_", is_flag=True, help="Delete every dead letter.")
@click.option(
    "--older-than",
    type=click.FLOAT,
    default=None,
    help="Only dead letters that died more than this many seconds ago.",
)
@click.pass_context
def dead_purge(
    ctx: click.Context, job_ids: tuple[int, ...], all_: bool, older_than: float | None
) -> None:
    """Delete dead letters for good (their history goes with them)."""
    if sum((bool(job_ids), all_, older_than is not None)) != 1:
        raise BadInput("dead purge: give job ids, --all or --older-than SECONDS (one of them)")
    deleted = _queue(ctx).purge_dead(list(job_ids) or None, older_than=older_than)
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


@app.command("dashboard")
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8787, help="Port to listen on.")
@click.option("--read-only", is_flag=True, help="No actions: pages only, every POST refused.")
@click.pass_context
def dashboard(ctx: click.Context, host: str, port: int, read_only: bool) -> None:
    """Serve the web dashboard (pip install 'jobkeeper[dashboard]').

    Listens on loopback only, unless $JOBKEEPER_DASHBOARD_PASSWORD is set:
    then any address, with HTTP basic auth (user jobkeeper) on every page.
    """
    from jobkeeper.dashboard.app import PASSWORD_ENV, is_loopback

    if not is_loopback(host) and not os.environ.get(PASSWORD_ENV):
        raise BadInput(
            f"--host {host} is not a loopback address: set {PASSWORD_ENV} to serve it "
            "there (with basic auth), or use --host 127.0.0.1"
        )
    try:
        import uvicorn

        from jobkeeper.dashboard import create_app
    except ImportError as exc:
        raise BadInput(
            f"the dashboard needs its extra ({exc.name} is missing): "
            "pip install 'jobkeeper[dashboard]'"
        ) from None
    jq = _queue(ctx)
    jq.backend.db_now()  # an unreachable database fails here, in one line
    console.print(
        f"jobkeeper dashboard on http://{host}:{port}/ for {jq.url.redacted()}"
        + (" (read-only)" if read_only else ""),
        markup=False,
        highlight=False,
    )
    uvicorn.run(create_app(jq, read_only=read_only), host=host, port=port, log_level="warning")


@app.command("doctor")
@_json_option
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the database and the settings: one line per check (ok, warn or
    fail) with what to do; exit 1 when any check fails.
    """
    from jobkeeper import doctor as checks_module

    checks = checks_module.run_checks(_queue(ctx))
    if as_json:
        render.print_json(console, [check.to_dict() for check in checks])
    else:
        styles = {"ok": "green", "warn": "yellow", "fail": "bold red"}
        width = max(len(check.name) for check in checks)
        for check in checks:
            console.print(
                f"[{styles[check.level]}]{check.level:<4}[/] {check.name:<{width}}  ",
                end="",
                highlight=False,
            )
            console.print(check.message, markup=False, highlight=False, soft_wrap=True)
    ctx.exit(checks_module.exit_code(checks))


_stale_after_option = click.option(
    "--stale-after",
    type=click.FLOAT,
    default=None,
    show_default=False,
    help="Seconds without a pass of a worker registering a periodic before it counts "
    "as stale (default: rescue_after, 60).",
)


@periodic_app.command("list")
@_stale_after_option
@_json_option
@click.pass_context
def periodic_list(ctx: click.Context, stale_after: float | None, as_json: bool) -> None:
    """List the stored periodic jobs; stale ones are registered by no running worker."""
    rows = _queue(ctx).periodic_list(stale_after=stale_after)
    if as_json:
        render.print_json(console, [row.to_dict() for row in rows])
    else:
        console.print(render.periodic_table(rows))


@periodic_app.command("prune")
@_stale_after_option
@_json_option
@click.pass_context
def periodic_prune(ctx: click.Context, stale_after: float | None, as_json: bool) -> None:
    """Delete the stale periodic jobs (no running worker registers them)."""
    names = _queue(ctx).periodic_prune(stale_after=stale_after)
    if as_json:
        render.print_json(console, {"pruned": names})
        return
    noun = "periodic" if len(names) == 1 else "periodics"
    shown = f": {' '.join(names)}" if names else ""
    console.print(f"pruned {len(names)} stale {noun}{shown}", markup=False, highlight=False)


@app.command("demo")
@click.option("--workers", type=click.INT, default=2, help="Worker processes (one is SIGKILLed).")
@click.option("--concurrency", type=click.INT, default=4, help="Jobs at once per worker.")
@click.pass_context
def demo(ctx: click.Context, workers: int, concurrency: int) -> None:
    """Hash every .py file of the standard library through the queue, SIGKILL a
    worker midway, and reconcile every job (uses ./jobkeeper-demo.db unless --database).
    """
    from jobkeeper.demo.runner import run_demo

    url = ctx.find_root().params.get("database")
    ctx.exit(run_demo(console, database_url=url, workers=workers, concurrency=concurrency))


_queue_argument = click.argument("name", cls=_Argument, doc="The queue's name.")


@queues_app.command("list")
@_json_option
@click.pass_context
def queues_list(ctx: click.Context, as_json: bool) -> None:
    """Every queue with jobs or settings: paused or not, its limits, its counts."""
    queues = _queue(ctx).queues()
    if as_json:
        render.print_json(console, [queue.as_dict() for queue in queues])
    else:
        console.print(render.queues_table(queues))


@queues_app.command("pause")
@_queue_argument
@click.pass_context
def queues_pause(ctx: click.Context, name: str) -> None:
    """Stop every worker from starting jobs of the queue (running jobs finish)."""
    _queue(ctx).pause(name)
    console.print(f"queue {name} paused", markup=False, highlight=False)


@queues_app.command("resume")
@_queue_argument
@click.pass_context
def queues_resume(ctx: click.Context, name: str) -> None:
    """Let workers start jobs of the queue again."""
    _queue(ctx).resume(name)
    console.print(f"queue {name} resumed", markup=False, highlight=False)


def _int_or_none(option: str, text: str | None) -> int | Unset | None:
    if text is None:
        return UNSET
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"{option} {text!r}: expected an integer or 'none'") from None


@queues_app.command("set")
@_queue_argument
@click.option(
    "--concurrency", default=None, help="Most jobs held at once, all workers ('none' lifts it)."
)
@click.option(
    "--rate-limit", default=None, help="Most starts per period: N/s, N/m or N/h ('none' lifts it)."
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
    if concurrency is None and rate_limit is None and max_pending is None:
        raise BadInput("queues set: give --concurrency, --rate-limit or --max-pending")
    rate: str | Unset | None = UNSET
    if rate_limit is not None:
        rate = None if rate_limit.strip().lower() == "none" else rate_limit
    info = _queue(ctx).configure_queue(
        name,
        concurrency=_int_or_none("--concurrency", concurrency),
        rate_limit=rate,
        max_pending=_int_or_none("--max-pending", max_pending),
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


# After the commands, so that the command list shows them last, as before.
app.add_command(jobs_app)
app.add_command(dead_app)
app.add_command(periodic_app)
app.add_command(queues_app)


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
