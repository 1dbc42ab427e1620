"""The JobQueue settings the tests run with, by name.

Every set starts from :data:`FAST` and changes only what its tests need
different; the line above each says why. Seconds throughout.
"""

from __future__ import annotations

from typing import Any

#: Workers that react in tenths of seconds: a beat every 0.1 s, a silent
#: holder rescued after 1 s, polls every 50 ms, retries almost at once, and a
#: stop that waits at most 2 s for running jobs.
FAST: dict[str, Any] = {
    "heartbeat_interval": 0.1,
    "rescue_after": 1.0,
    "poll_interval": 0.05,
    "max_backoff": 0.05,
    "shutdown_grace": 2.0,
}

#: Worker processes of the soak app (``benchmarks.soak.app``: under injected
#: faults, with long jobs, behind PgBouncer): beats every 0.2 s still give
#: five per rescue window while several processes share the cores, and a stop
#: waits up to 10 s so that jobs of a few seconds finish rather than go back.
SOAK: dict[str, Any] = {
    **FAST,
    "heartbeat_interval": 0.2,
    "max_backoff": 0.1,
    "shutdown_grace": 10.0,
}

#: Sessions that turn read-only: heartbeats fail until a worker has
#: reconnected, so the rescue window is 3 s (15 beats) rather than 1 s, and a
#: worker busy reconnecting is not taken for lost.
READ_ONLY: dict[str, Any] = {**FAST, "heartbeat_interval": 0.2, "rescue_after": 3.0}

#: Graceful shutdown: rescue_after is long (120 s) so that jobs a stopping
#: worker hands back are seen picked up at once, never after a rescue.
SHUTDOWN: dict[str, Any] = {**FAST, "heartbeat_interval": 0.5, "rescue_after": 120.0}

#: Periodic workers SIGKILLed and restarted: a rescue window of 2 s (ten
#: beats) for a fleet of three processes that start and die during the test.
FLEET: dict[str, Any] = {**FAST, "heartbeat_interval": 0.2, "rescue_after": 2.0}

#: A heartbeat, and so a cancel poll, far slower than a task's reaction: the
#: worker has not seen a cancel request by the time the task ends.
SLOW_HEARTBEAT: dict[str, Any] = {**FAST, "heartbeat_interval": 2.0, "rescue_after": 30.0}


def soak_env(settings: dict[str, Any]) -> dict[str, str]:
    """``settings`` as the soak app reads them: ``SOAK_<NAME>`` variables."""
    return {f"SOAK_{key.upper()}": str(value) for key, value in settings.items()}
