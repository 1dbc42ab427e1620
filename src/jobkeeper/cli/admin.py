"""``jobkeeper migrate``, ``status``, ``dashboard``, ``doctor`` and ``demo``:
the database, the fleet at a glance, and the demo.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any

import click

from jobkeeper.cli import render
from jobkeeper.cli.common import (
    COUNT,
    DECIMAL_NUMBER,
    BadInput,
    Command,
    PortNumber,
    console,
    err_console,
    json_option,
    open_queue,
    terminate_as_interrupt,
)
from jobkeeper.cli.loading import open_app_queue, print_warning
from jobkeeper.config import MIGRATE_LOCK_WAIT
from jobkeeper.database_url import DATABASE_URL_ENV, redact_secrets
from jobkeeper.version import __version__
from jobkeeper.worker.schema import require_migrated


@click.command("migrate", cls=Command)
@click.option(
    "--lock-wait",
    type=DECIMAL_NUMBER,
    default=MIGRATE_LOCK_WAIT,
    help="Seconds to keep trying for the locks migrate takes, saying on stderr who holds "
    "them, before giving up with nothing changed (exit 1). On PostgreSQL each try waits "
    "at most 1 s, so enqueues and claims go on between tries.",
)
@click.pass_context
def migrate(ctx: click.Context, lock_wait: float) -> None:
    """Create or upgrade the schema (idempotent; safe to run concurrently)."""
    jq = open_queue(ctx)
    version = jq.migrate(lock_wait=lock_wait)
    # No markup: the URL is the user's text ("[/]" in it crashed Rich).
    console.print(
        f"schema at version {version} on {jq.url.redacted()}", markup=False, highlight=False
    )
    known = jq.backend.schema_expected()
    if version > known:
        # Not an error: an older release's deploy step may still run it.
        err_console.print(
            f"note: this jobkeeper ({__version__}) knows schema versions up to {known}; "
            f"the database is at {version}, so nothing was applied: upgrade jobkeeper here",
            markup=False,
            highlight=False,
        )


@click.command("status", cls=Command)
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Job counts per queue and status, and the registered workers (a worker
    without a heartbeat for longer than its own rescue_after is marked stale).
    """
    jq = open_queue(ctx)
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


def _check_listen(host: str, port: int) -> int:
    """Fail in one line (exit 1) when ``host:port`` cannot be listened on:
    uvicorn logs a bind failure and exits 3, after the "serving" line.
    Returns the port: for ``--port 0``, the free one the system gave, so the
    URL printed is one that answers.
    """
    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.create_server((address, port), family=family) as listener:
            return int(listener.getsockname()[1])
    except OSError as exc:
        raise click.ClickException(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})"
        ) from None


@click.command("dashboard", cls=Command)
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--port", type=PortNumber(0), default=8787, help="Port to listen on.")
@click.option("--read-only", is_flag=True, help="No actions: pages only, every POST refused.")
@click.option(
    "--database-timeout",
    type=click.FloatRange(min=0.1, max=86400),
    default=5.0,
    show_default=True,
    help="Seconds a page, /metrics or an action waits for the database before answering 503.",
)
@click.pass_context
def dashboard(
    ctx: click.Context, host: str, port: int, read_only: bool, database_timeout: float
) -> None:
    """Serve the web dashboard (pip install 'jobkeeper[dashboard]').

    Listens on loopback only, unless $JOBKEEPER_DASHBOARD_PASSWORD is set:
    then any address, with HTTP basic auth (user jobkeeper) on every page.
    """
    if not math.isfinite(database_timeout):  # nan passes FloatRange's comparisons
        raise BadInput(f"--database-timeout {database_timeout}: give seconds from 0.1 to 86400")
    try:
        import uvicorn

        from jobkeeper.dashboard import create_app
        from jobkeeper.dashboard.app import PASSWORD_ENV, is_loopback
        from jobkeeper.dashboard.security import dashboard_password
    except ImportError as exc:
        raise BadInput(
            f"the dashboard needs its extra ({exc.name} is missing): "
            "pip install 'jobkeeper[dashboard]'"
        ) from None
    # A blank password (" ") is refused (exit 2) before anything else.
    password = dashboard_password()
    if not is_loopback(host) and password is None:
        raise BadInput(
            f"--host {host} is not a loopback address: set {PASSWORD_ENV} to serve it "
            "there (with basic auth), or use --host 127.0.0.1"
        )
    jq = open_queue(ctx)
    jq.backend.db_now()  # an unreachable database fails here, in one line
    # On an unmigrated PostgreSQL database it served, and answered every page
    # (/metrics too) with a 500 naming the missing table.
    require_migrated(jq.backend, where=jq.url.redacted())
    port = _check_listen(host, port)
    app = create_app(jq, read_only=read_only, password=password, database_timeout=database_timeout)
    console.print(
        # An IPv6 address goes in brackets in a URL (RFC 3986).
        f"jobkeeper dashboard on http://{f'[{host}]' if ':' in host else host}:{port}/ "
        f"for {jq.url.redacted()}" + (" (read-only)" if read_only else ""),
        markup=False,
        highlight=False,
    )
    _serve(uvicorn, app, host, port)


def _serve(uvicorn: Any, app: Any, host: str, port: int) -> None:
    """Serve ``app`` until SIGINT or SIGTERM.

    Ctrl-C ends the command with exit 130, as any interrupted command (the
    README's exit codes): ``uvicorn.run`` swallows the KeyboardInterrupt
    that its server raises again after a graceful stop, and returned 0.
    SIGTERM, raised again the same way, ends the process as SIGTERM does.

    Raises:
        click.Abort: the server stopped on a signal (exit 130).
    """
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run()
    except KeyboardInterrupt:
        raise click.Abort from None
    if server.should_exit:
        # Stopped on a signal whose default action did not end the process
        # (SIGINT ignored, as in a background job of a script).
        raise click.Abort


@click.command("doctor", cls=Command)
@click.option(
    "--app",
    "app_spec",
    default=None,
    help="Your JobQueue (package.module:attribute), to check the settings your "
    "workers run with; default: jobkeeper's defaults.",
)
@json_option
@click.pass_context
def doctor(ctx: click.Context, app_spec: str | None, as_json: bool) -> None:
    """Check the database and the settings: one line per check (ok, warn or
    fail) with what to do; exit 1 when any check fails.
    """
    from jobkeeper import doctor as checks_module

    jq = open_queue(ctx) if app_spec is None else open_app_queue(ctx, app_spec)
    checks = checks_module.run_checks(jq, app_settings=app_spec is not None)
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


@click.command("demo", cls=Command)
@click.option("--workers", type=COUNT, default=2, help="Worker processes (one is SIGKILLed).")
@click.option("--concurrency", type=COUNT, default=4, help="Jobs at once per worker.")
@click.pass_context
def demo(ctx: click.Context, workers: int, concurrency: int) -> None:
    """Hash every .py file of the standard library through the queue, SIGKILL a
    worker midway, and reconcile every job (uses a fresh ./jobkeeper-demo.db unless
    --database; not $JOBKEEPER_DATABASE_URL, and it says so when that is set).
    """
    from jobkeeper.demo.runner import DEFAULT_DEMO_URL, run_demo

    url = ctx.find_root().params.get("database")
    environment = os.environ.get(DATABASE_URL_ENV)
    if url is None and environment:
        # The demo starts from a fresh file of its own, deleting the last
        # one: never the database the variable names, unless asked.
        print_warning(
            f"${DATABASE_URL_ENV} ({redact_secrets(environment.strip())}) is not used: the "
            f"demo runs on a fresh {DEFAULT_DEMO_URL} of its own; pass --database URL to run it "
            "on that database"
        )
    with terminate_as_interrupt():
        code = run_demo(console, database_url=url, workers=workers, concurrency=concurrency)
    ctx.exit(code)
