"""jobkeeper tasks for the benchmark worker.

Run as ``jobkeeper --database URL worker --app benchmarks.apps.jobkeeper_app:jq``;
the CLI's ``--database`` replaces the URL below (``JobQueue.using``).
"""

from __future__ import annotations

from benchmarks.apps.stamps import record
from jobkeeper import JobQueue

jq = JobQueue("sqlite:///unused-benchmark.db")


@jq.task
def noop() -> None:
    """Does nothing: the drain and RSS measurements time the queue alone."""
    return None


@jq.task
def stamp(i: int, t: float) -> None:
    """Records its start time (latency measurement)."""
    record(i, t)


@jq.task
async def noop_async() -> None:
    """The async variant of ``noop`` (runs on the worker's event loop)."""
    return None
