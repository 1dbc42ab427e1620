"""procrastinate tasks for the benchmark worker.

Run as ``procrastinate --app benchmarks.apps.procrastinate_app.app worker``;
the database is ``$BENCH_DSN``.
"""

from __future__ import annotations

import os

import procrastinate

from benchmarks.apps.stamps import record

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    )
)


@app.task(name="noop")
async def noop() -> None:
    """Does nothing (async: procrastinate's native kind of task)."""
    return None


@app.task(name="stamp")
async def stamp(i: int, t: float) -> None:
    """Records its start time (latency measurement)."""
    record(i, t)
