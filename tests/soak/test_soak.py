"""The short chaos soak, on both backends (part of the normal test run).

Worker processes run a mix of jobs while faults are injected: SIGKILL and
restart, SIGSTOP past rescue_after, and on PostgreSQL (a private server the
soak starts) ``pg_terminate_backend``, restarts (fast, immediate, kill -9)
and partitions: each worker runs in a network namespace of its own and hosts
are cut off both ways, only outgoing and only incoming (benchmarks/soak/netns.py).
Meanwhile a requeuer takes dead letters back by every public way (API and
CLI). Then the history checker must pass: nothing lost, no two live holders,
every completion from the current holder, claim numbers (fences) growing
across requeues, nothing lost out of the dead letters. The long run is
``python -m benchmarks.soak.run`` (see benchmarks/soak/README.md).

The flow-control variant runs the same faults with a concurrency cap and a
rate limit on one queue and serial keys on a share of another's jobs; the
checker then also requires that the history never shows more of the capped
queue running at once than its cap, nor two jobs of a key at once. Its long
run is ``make soak``.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from benchmarks.soak.requeuer import WAYS
from benchmarks.soak.run import SoakConfig, run_soak

pytestmark = [pytest.mark.soak, pytest.mark.slow]

BACKENDS = [
    name.strip()
    for name in os.environ.get("JOBKEEPER_TEST_BACKENDS", "sqlite,postgres").split(",")
    if name.strip()
]

SHORT = {
    # 45 s: the partition kinds (4.5 s each) come into the rotation too.
    "postgres": SoakConfig(
        backend="postgres",
        seconds=45,
        jobs=2250,
        partitions=True,
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


def assert_requeued(result):
    """The requeuer took dead letters back by every way, and some moves were
    confirmed (the checker then held their fences and what followed).
    """
    ways = result.requeues
    assert set(ways) == set(WAYS)
    assert all(way["calls"] >= 1 for way in ways.values()), ways
    confirmed = sum(way["confirmed"] for way in ways.values())
    assert confirmed >= 1, ways
    assert confirmed == result.report.stats["requeues_confirmed"]
    assert f"{confirmed} confirmed in all" in result.summary


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_chaos_soak(backend):
    result = run_soak(SHORT[backend])
    print(result.summary)
    assert result.passed, result.summary
    stats = result.report.stats
    assert stats["lost"] == 0
    assert stats["duplicates"] == 0
    # Every kind comes once within the rotation's first turn (PostgreSQL's
    # has ten kinds with partitions): a kill and a stop at least once.
    assert result.faults.get("kill", 0) >= 1
    assert result.faults.get("stop", 0) >= 1
    assert not result.unexpected_exits
    # The poison jobs (SIGKILL their worker every attempt) were stopped by
    # the crash budget (run_soak checks each is dead for its crashes, and
    # bounds the workers they killed).
    assert result.poison_kills >= 1
    assert_requeued(result)
    if backend == "postgres":
        for kind in (
            "terminate",
            "pg_restart_fast",
            "pg_crash_immediate",
            "pg_kill9",
            "pg_outage_long",
            "cut_both",
            "cut_out",
            "cut_in",
        ):
            assert result.faults.get(kind, 0) >= 1, kind
        assert result.rescued_holders["live"] == 0, result.rescued_holders
        assert result.probe["ok"], result.probe
        assert "unavailable" in result.probe["message"]


#: Shorter fault phases, and no no-op (memory) phase: the plain soak covers it.
LIMITS = {
    "postgres": dataclasses.replace(
        SHORT["postgres"], limits=True, seconds=30, jobs=1200, noop_jobs=0, partitions=False
    ),
    "sqlite": dataclasses.replace(SHORT["sqlite"], limits=True, jobs=700, noop_jobs=0),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_chaos_soak_with_limits(backend):
    result = run_soak(LIMITS[backend])
    print(result.summary)
    assert result.passed, result.summary
    stats = result.report.stats
    assert stats["lost"] == 0
    assert stats["duplicates"] == 0
    assert stats["serial_overlaps"] == 0
    assert result.report.count("cap_exceeded") == 0
    # The limits were reached, so they were tested: the capped queue ran at
    # its cap, and the keyed jobs ran.
    assert stats["most_running"]["bulk"] == LIMITS[backend].cap
    assert stats["serial_keys"] == LIMITS[backend].serial_keys
    assert result.faults.get("kill", 0) >= 2
    assert result.faults.get("stop", 0) >= 1
    assert not result.unexpected_exits
    assert_requeued(result)
