"""``jobkeeper worker``: run a worker of the user's app."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading

import click

from jobkeeper.api import JobQueue
from jobkeeper.cli.common import (
    COUNT,
    BadInput,
    Command,
    PortNumber,
)
from jobkeeper.cli.loading import load_app
from jobkeeper.errors import printable
from jobkeeper.joblog import JsonFormatter
from jobkeeper.queues import parse_queue_share
from jobkeeper.worker.log_output import TEXT_FORMAT, log_to_stderr


@click.command("worker", cls=Command)
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
@click.option("--concurrency", type=COUNT, default=10, help="Most jobs running at once.")
@click.option(
    "--burst",
    is_flag=True,
    help="Run what is due, then exit; jobs that come due later than poll_interval "
    "(delayed, or waiting out a retry's backoff), and jobs of paused queues or held back "
    "by limits for longer, stay for the next worker.",
)
@click.option(
    "--prefetch",
    type=COUNT,
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
    type=PortNumber(1),
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
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    for text in queue:
        _, share = parse_queue_share(text)
        if share is not None and share > concurrency:
            raise BadInput(
                f"--queue {text!r}: the share {share} is more than --concurrency {concurrency}"
            )
    log_to_stderr(level, formatter)
    # Warnings as log lines: --log-format json keeps stderr one JSON object a line.
    jq = load_app(
        app_spec,
        ctx.find_root().params.get("database"),
        warn=logging.getLogger("jobkeeper.worker").warning,
    )
    if metrics_port is not None:
        _serve_metrics(jq, metrics_port, metrics_host)
    code = jq.run_worker(
        queues=list(queue) or None, concurrency=concurrency, burst=burst, prefetch=prefetch
    )
    _exit_past_task_threads(code)
    ctx.exit(code)


def _exit_past_task_threads(code: int) -> None:
    """End the process now if threads a task started (not daemons) still
    run: the interpreter would wait for them at exit, and a stopped worker
    whose process lives on looks hung to whoever sent the SIGTERM (a
    second one killed it, exit 143). Exit handlers still run first.
    """
    left = [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
    ]
    if not left:
        return
    # Past the worker's run its logging may fail (a task closed sys.stderr):
    # the exit must happen all the same.
    with contextlib.suppress(Exception):
        logging.getLogger("jobkeeper.worker").warning(
            "threads started by tasks still run (%s): the worker has stopped, and its "
            "process does not wait for them",
            ", ".join(printable(thread.name) for thread in left),
        )
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # what a normal exit runs, and os._exit skips
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _serve_metrics(jq: JobQueue, port: int, host: str) -> None:
    """Count this worker's jobs (an event listener) and serve them on ``host:port``."""
    try:
        from jobkeeper.metrics import WorkerMetrics

        metrics = WorkerMetrics(tasks=jq.tasks)
    except ImportError as exc:
        raise BadInput(
            f"--metrics-port needs prometheus-client ({exc.name} is missing): "
            "pip install 'jobkeeper[metrics]'"
        ) from None
    try:
        metrics.serve(port, host)
    except OSError as exc:
        # Exit 1, as the dashboard's --port: a port in use is no bad input.
        raise click.ClickException(
            f"--metrics-host {host} --metrics-port {port}: cannot listen there "
            f"({exc.strerror or exc})"
        ) from None
    jq.on_event(metrics, metrics.kinds)
