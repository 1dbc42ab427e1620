"""oban workers for the benchmark worker (the Python Oban, PyPI ``oban``).

Imported only by the Python >= 3.12 interpreter of ``.venv-oban`` (see
``benchmarks/oban_env.py``): oban itself cannot be imported on 3.11. The
worker is oban's own CLI,

    oban start --dsn URL --queues default:10 --cron-modules benchmarks.apps.oban_app

and the parent's enqueues go through ``benchmarks/apps/oban_adapter.py``. A
job names its worker by import path (``benchmarks.apps.oban_app.Noop``); the
worker process resolves it by importing this module (``--cron-modules``
imports it at start instead of at the first job, and stops the CLI from
grepping the whole repository, virtualenvs included, for cron workers).
"""

from __future__ import annotations

from typing import Any

from oban import worker

from benchmarks.apps.stamps import record


@worker(queue="default")
class Noop:
    """Does nothing (async: oban's workers are natively async)."""

    async def process(self, job: Any) -> None:
        return None


@worker(queue="default")
class Stamp:
    """Records its start time (latency measurement)."""

    async def process(self, job: Any) -> None:
        record(job.args["i"], job.args["t"])
