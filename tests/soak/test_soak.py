"""The short chaos soak, on both backends (part of the normal test run).

Worker processes run a mix of jobs while faults are injected: SIGKILL and
restart, SIGSTOP past rescue_after, and on PostgreSQL (a private server the
soak starts) ``pg_terminate_backend`` and restarts (fast, immediate, kill -9).
Then the history checker must pass: nothing lost, no two live holders, every
completion from the current holder. The long run is
``python -m benchmarks.soak.run`` (see benchmarks/soak/README.md).
"""

from __future__ import annotations

import os

import pytest
from benchmarks.soak.run import SoakConfig, run_soak

pytestmark = [pytest.mark.soak, pytest.mark.slow]

BACKENDS = [
    name.strip()
    for name in os.environ.get("JOBKEEPER_TEST_BACKENDS", "sqlite,postgres").split(",")
    if name.strip()
]

SHORT = {
    "postgres": SoakConfig(
        backend="postgres",
        seconds=30,
        jobs=1500,
        noop_jobs=5000,
        fault_every=1.5,
        stop_for=4.5,
        probe_pool_timeout=3.0,
        verbose=False,
    ),
    "sqlite": SoakConfig(
        backend="sqlite",
        seconds=15,
        jobs=900,
        noop_jobs=5000,
        fault_every=1.5,
        stop_for=4.5,
        verbose=False,
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_chaos_soak(backend):
    result = run_soak(SHORT[backend])
    print(result.summary)
    assert result.passed, result.summary
    stats = result.report.stats
    assert stats["lost"] == 0
    assert stats["duplicates"] == 0
    assert result.faults.get("kill", 0) >= 2
    assert result.faults.get("stop", 0) >= 1
    assert not result.unexpected_exits
    # The poison jobs (SIGKILL their worker every attempt) were stopped by
    # the crash budget: at most max_crashes + 2 workers each (run_soak
    # checks each is dead for its crashes after max_crashes + 1 attempts).
    assert 1 <= result.poison_kills <= 2 * (2 + 2)
    if backend == "postgres":
        for kind in (
            "terminate",
            "pg_restart_fast",
            "pg_crash_immediate",
            "pg_kill9",
            "pg_outage_long",
        ):
            assert result.faults.get(kind, 0) >= 1, kind
        assert result.probe["ok"], result.probe
        assert "unavailable" in result.probe["message"]
