"""The demo's app: one task that measures a real file.

Worker processes load it with ``--app jobkeeper.demo.tasks:jq``. Timings are
short so the demo shows a rescue and retries within seconds.
"""

from __future__ import annotations

import hashlib
import time

from jobkeeper import JobQueue, current_job

#: The demo's queue; the orchestrator and the workers share its settings.
jq = JobQueue(
    heartbeat_interval=0.5,
    rescue_after=2.0,
    poll_interval=0.2,
    max_backoff=1.0,
    shutdown_grace=5.0,
)


@jq.task(queue="demo", max_attempts=3)
def count_file(path: str, fail_first: int = 0) -> dict[str, object]:
    """Read ``path`` and return its line, word and byte counts and SHA-256.

    Args:
        path: a file to read.
        fail_first: raise on the first ``fail_first`` attempts (the demo's
            deterministic flaky and always-failing jobs).
    """
    attempt = current_job().attempt
    if attempt <= fail_first:
        raise RuntimeError(f"simulated failure on attempt {attempt} of {path}")
    with open(path, "rb") as handle:
        data = handle.read()
    time.sleep(0.002)  # stand-in for I/O, so a killed worker holds jobs in flight
    return {
        "lines": len(data.splitlines()),
        "words": len(data.split()),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
