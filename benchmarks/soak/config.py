"""What one soak run does and what it found (the driver is :mod:`benchmarks.soak.run`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from benchmarks.soak.history import Report


@dataclasses.dataclass
class SoakConfig:
    """What one soak run does (the defaults are the CI-sized short run)."""

    backend: str = "postgres"
    seconds: float = 30.0  # the fault phase
    jobs: int = 2500  # chaos jobs enqueued during the fault phase
    noop_jobs: int = 6000  # the memory phase
    workers: int = 4
    concurrency: int = 8
    heartbeat_interval: float = 0.5
    rescue_after: float = 3.0
    poll_interval: float = 0.2
    max_backoff: float = 0.5
    fault_every: float = 2.0  # seconds between faults
    stop_for: float | None = None  # SIGSTOP duration (default 2 x rescue_after)
    drain_timeout: float = 120.0
    probe_pool_timeout: float | None = None  # None: jobkeeper's own POOL_TIMEOUT
    rss_bound_mib: float = 32.0
    poison_jobs: int = 2  # jobs that SIGKILL their worker at every attempt
    max_crashes: int = 2
    #: Seconds between the requeuer's takes from the dead letters (0: none).
    requeue_every: float = 2.0
    seed: int = 1
    keep: bool = False
    out: Path | None = None  # where to put logs (default: a temp dir)
    verbose: bool = True
    #: Flow control on: the bulk queue gets a concurrency cap and a rate
    #: limit, and a share of the default queue's jobs get serial keys; the
    #: checker then also holds the cap and the keys (see history.py).
    limits: bool = False
    cap: int = 3
    rate_per_second: int = 20
    serial_share: float = 0.3  # of the default queue's jobs
    serial_keys: int = 20
    #: Partitions on (PostgreSQL only): each worker runs in a network
    #: namespace of its own and the rotation cuts hosts off (both ways, only
    #: outgoing, only incoming) for ``stop_for`` seconds, then heals them.
    partitions: bool = False


@dataclasses.dataclass
class SoakResult:
    config: SoakConfig
    report: Report
    faults: dict[str, int]
    terminated_connections: int
    enqueue_refused: int
    enqueue_errors: list[str]
    probe: dict[str, Any]
    rss: dict[str, Any]
    exit_codes: dict[int, int | None]
    unexpected_exits: list[str]
    log_problems: list[str]
    worker_starts: int
    poison_kills: int
    rescued_holders: dict[str, Any]
    elapsed: float
    failures: list[str]
    summary: str = ""
    #: The requeuer's calls and jobs per way (see requeuer.Requeuer.stats).
    requeues: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures
