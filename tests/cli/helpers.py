"""What the CLI tests share: the job keys of ``--json``, the newest schema
version, and ways to run the command and read its errors.
"""

from __future__ import annotations

import os
import subprocess
import sys

from jobkeeper import JobStatus
from jobkeeper.backends.sqlite.backend import MIGRATIONS

#: The newest schema version (both backends number migrations alike).
LATEST = MIGRATIONS[-1][0]

JOB_KEYS = {
    "id",
    "task",
    "args",
    "queue",
    "status",
    "priority",
    "attempt",
    "max_attempts",
    "fence",
    "unstarted_returns",
    "serial_key",
    "run_alone",
    "crashes",
    "alone_fence",
    "scheduled_at",
    "created_at",
    "attempted_at",
    "finished_at",
    "worker_id",
    "unique_key",
    "errors",
    "result",
    "cancel_requested",
    "dead_reason",
    "args_error",
    "trace_context",
}
STATUSES = [s.value for s in JobStatus]


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert lines[0][len("error: ") :].strip(), err
    for needle in needles:
        assert needle in lines[0], err
