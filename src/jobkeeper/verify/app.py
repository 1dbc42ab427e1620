"""The task ``jobkeeper verify`` runs, in worker processes it starts.

    python -m jobkeeper --database URL worker --app jobkeeper.verify.app:jq --queue jkverify_...

Everything comes from the environment the driver sets: ``JKVERIFY_RUN`` (the
run's unique name: the task is ``<run>.work``), ``JKVERIFY_LOG_DIR`` (where
each process appends its execution log), ``JKVERIFY_HEARTBEAT_INTERVAL``,
``JKVERIFY_RESCUE_AFTER``, ``JKVERIFY_POLL_INTERVAL`` and
``JKVERIFY_MAX_BACKOFF`` (seconds). The URL is the worker's ``--database``.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from jobkeeper.api import JobQueue
from jobkeeper.context import current_job
from jobkeeper.errors import Discard, Retry
from jobkeeper.verify.history import ExecLog

#: The run's name when none is set (an import for the docs, a dry look).
DEFAULT_RUN = "jkverify"
#: Ten years: a verify worker that becomes the maintenance leader must never
#: prune the user's finished jobs sooner than the user's own workers would.
KEEP_FINISHED = 10 * 365 * 86_400.0


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(f"JKVERIFY_{name}")
    return float(value) if value else default


RUN = os.environ.get("JKVERIFY_RUN") or DEFAULT_RUN
TASK = f"{RUN}.work"

jq = JobQueue(
    heartbeat_interval=_seconds("HEARTBEAT_INTERVAL", 0.5),
    rescue_after=_seconds("RESCUE_AFTER", 3.0),
    poll_interval=_seconds("POLL_INTERVAL", 0.2),
    max_backoff=_seconds("MAX_BACKOFF", 0.5),
    shutdown_grace=5.0,
    retention=KEEP_FINISHED,
)

_log_dir = os.environ.get("JKVERIFY_LOG_DIR")
LOG = ExecLog(_log_dir) if _log_dir else None


class InjectedError(RuntimeError):
    """The failure a verify job raises on purpose."""


@jq.task(name=TASK)
def work(n: int, ms: float, mode: str = "ok", fails: int = 0) -> dict[str, Any]:
    """Sleeps ``ms`` milliseconds, then succeeds or fails as ``mode`` says:
    ok | flaky (raises ``fails`` times) | retry (``Retry`` ``fails`` times) |
    fail (always) | discard. Returns ``{"n", "worker", "attempt"}``: the
    execution that produced the result.
    """
    job = current_job()
    worker = job.worker_id or "?"
    if LOG is not None:
        LOG.start(job.id, job.attempt, worker, job.fence)
    outcome = "error"
    try:
        time.sleep(ms / 1000)
        if mode == "fail" or (mode == "flaky" and job.attempt <= fails):
            raise InjectedError(f"{mode} on attempt {job.attempt}")
        if mode == "retry" and job.attempt <= fails:
            raise Retry(delay=random.uniform(0.0, 0.2), reason=f"retry on attempt {job.attempt}")
        if mode == "discard":
            raise Discard("discarded on purpose")
        outcome = "ok"
    finally:
        if LOG is not None:
            LOG.end(job.id, job.attempt, worker, job.fence, outcome)
    return {"n": n, "worker": worker, "attempt": job.attempt, "fence": job.fence}
