"""The app flow-control worker subprocesses load (``tests.flow.app:jq``).

``timed`` appends ``<job id> <pid> <start> <end> <key> <claimed>`` (Unix
seconds; ``claimed``: the claim's ``attempted_at``, the database clock when the
claiming statement began) to ``record`` with one O_APPEND write, so lines of
concurrent processes never mix.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobkeeper import JobQueue, current_job

SETTINGS: dict[str, Any] = json.loads(os.environ.get("JK_E2E_SETTINGS", "{}"))
jq = JobQueue(os.environ.get("JK_E2E_DATABASE", "sqlite:///unused-flow.db"), **SETTINGS)


@jq.task(max_attempts=10)
def timed(seconds: float, record: str, key: str = "-") -> None:
    start = time.time()
    time.sleep(seconds)
    job = current_job()
    claimed = job.attempted_at.timestamp() if job.attempted_at is not None else 0.0
    line = f"{job.id} {os.getpid()} {start:.6f} {time.time():.6f} {key} {claimed:.6f}\n".encode()
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
