"""The measurements. Each function measures one thing once, in a database of
its own created for it, and returns ``{metric: value}``; it raises
:class:`NotAvailableError` (or anything else) when the figure cannot be had, and
the caller records the reason instead of a number.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import raw
from benchmarks.harness import (
    NotAvailableError,
    PgServer,
    WorkerProcess,
    fresh_sqlite,
    log,
    percentile,
    read_stamps,
    wait_drained,
    wait_for,
)
from benchmarks.libs import CallTimes, Jobkeeper, Library

MB = 1024 * 1024


@dataclass(frozen=True)
class Sizes:
    single: int
    bulk: int
    bulk_batch: int
    drain: int
    latency_jobs: int
    latency_gap: float
    raw_per_job: int
    raw_batched: int
    raw_batch: int
    raw_clients: tuple[int, ...]
    sqlite_raw_clients: tuple[int, ...]
    scale: tuple[int, ...]
    scale_claims: int
    scale_limit: int
    rss: int


FULL = Sizes(
    single=2_000,
    bulk=20_000,
    bulk_batch=1_000,
    drain=20_000,
    latency_jobs=200,
    latency_gap=0.020,
    raw_per_job=4_000,
    raw_batched=20_000,
    raw_batch=100,
    raw_clients=(1, 2, 4, 8),
    sqlite_raw_clients=(1, 2, 4),
    scale=(10_000, 1_000_000, 10_000_000),
    scale_claims=300,
    scale_limit=10,
    rss=1_000_000,
)

QUICK = Sizes(
    single=300,
    bulk=5_000,
    bulk_batch=1_000,
    drain=2_000,
    latency_jobs=200,
    latency_gap=0.020,
    raw_per_job=600,
    raw_batched=5_000,
    raw_batch=100,
    raw_clients=(1, 2, 4, 8),
    sqlite_raw_clients=(1, 2, 4),
    scale=(10_000, 1_000_000),
    scale_claims=150,
    scale_limit=10,
    rss=50_000,
)


def count_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


@dataclass
class Context:
    backend: str  # "postgres" or "sqlite"
    sizes: Sizes
    runs: int
    workdir: Path
    server: PgServer | None = None
    _logs: Counter[str] = field(default_factory=Counter)

    @contextlib.contextmanager
    def fresh(self, label: str) -> Iterator[str]:
        if self.backend == "sqlite":
            with fresh_sqlite(label) as url:
                yield url
        else:
            assert self.server is not None
            with self.server.fresh(label) as url:
                yield url

    def log_path(self, label: str) -> Path:
        """A new file name in the work directory (never one used before)."""
        label = f"{self.backend}-{label}"
        self._logs[label] += 1
        path = self.workdir / f"{label}-{self._logs[label]}.log"
        while path.exists() or path.with_suffix(".txt").exists():
            self._logs[label] += 1
            path = self.workdir / f"{label}-{self._logs[label]}.log"
        return path

    def analyze(self, lib: Library, url: str) -> None:
        with lib.probe(url) as probe:
            probe.execute("ANALYZE")


# -- enqueue --------------------------------------------------------------------


def call_figures(metric: str, times: CallTimes, n: int) -> dict[str, float]:
    """``metric`` (jobs/s: calls / total seconds) and ``metric_p50``/``_p99``
    (ms: percentiles of the per-call durations) of the same ``n`` calls.
    """
    if len(times.durations) != n:
        raise NotAvailableError(f"{len(times.durations)} call durations for {n} calls")
    ms = [d * 1000 for d in times.durations]
    return {
        metric: n / times.seconds,
        f"{metric}_p50": percentile(ms, 50),
        f"{metric}_p99": percentile(ms, 99),
    }


# -- drain ----------------------------------------------------------------------


def drain_timeout(n: int) -> float:
    return 120.0 + n / 10.0


def drain_backlog(
    ctx: Context,
    lib: Library,
    url: str,
    n: int,
    *,
    label: str,
    on_progress: Callable[[WorkerProcess], None] | None = None,
) -> dict[str, float]:
    """Start the worker on a filled backlog of ``n`` and time it to empty.
    ``on_progress(worker)`` is called once, when the first jobs are done.
    """
    with lib.probe(url) as probe:
        left = probe.remaining()
        if left != n:
            raise NotAvailableError(f"the backlog holds {left} jobs, expected {n}")
        argv, env = lib.worker_command(url)
        worker = WorkerProcess(argv, env, ctx.log_path(f"{lib.name}-{label}"))
        called: list[bool] = []

        def sample(_now: float, left: int) -> None:
            if on_progress is not None and left < n and not called:
                called.append(True)
                on_progress(worker)

        try:
            trace = wait_drained(
                probe.remaining, n, worker, timeout=drain_timeout(n), on_sample=sample
            )
        finally:
            worker.stop()
        if trace.done is None:
            raise NotAvailableError(
                f"not drained after {drain_timeout(n):.0f}s: {trace.remaining} of {n} left "
                f"({worker.log_tail(1)})"
            )
        finished = probe.finished()
        if finished != n:
            raise NotAvailableError(f"backlog gone but {finished} of {n} jobs recorded as done")
    assert trace.first_progress is not None and trace.left_at_first is not None
    # The steady rate counts only the jobs done after the first were seen
    # (as the raw drain is timed from its clients' first claim, after their
    # start-up); the start-up, spawn to first jobs done, is its own figure.
    return {
        "drain": n / (trace.done - trace.started),
        "drain_steady": trace.left_at_first / max(trace.done - trace.first_progress, 1e-9),
        "drain_startup": (trace.first_progress - trace.started) * 1000,
    }


def drain(ctx: Context, lib: Library) -> dict[str, float]:
    n = ctx.sizes.drain
    with ctx.fresh(f"{lib.name}_drain") as url:
        lib.prepare(url)
        lib.fill(url, n)
        ctx.analyze(lib, url)
        return drain_backlog(ctx, lib, url, n, label="drain")


# -- latency --------------------------------------------------------------------


def latency(ctx: Context, lib: Library) -> dict[str, float]:
    n, gap = ctx.sizes.latency_jobs, ctx.sizes.latency_gap
    with ctx.fresh(f"{lib.name}_latency") as url:
        lib.prepare(url)
        stamps_path = ctx.log_path(f"{lib.name}-stamps").with_suffix(".txt")
        argv, env = lib.worker_command(url)
        env = {**env, "BENCH_STAMP_FILE": str(stamps_path)}
        with (
            WorkerProcess(argv, env, ctx.log_path(f"{lib.name}-latency")) as worker,
            lib.stamper(url) as enqueue,
        ):
            enqueue(-1, time.time())
            if not wait_for(lambda: -1 in read_stamps(stamps_path), 60):
                worker.check_alive()
                raise NotAvailableError(
                    f"the worker never ran the warm-up job ({worker.log_tail(1)})"
                )
            time.sleep(1.5)  # let the worker go idle
            returned: dict[int, float] = {}
            base = time.perf_counter()
            for i in range(n):
                pause = base + i * gap - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                answered = enqueue(i, time.time())
                returned[i] = time.time() if answered is None else answered
            wait_for(lambda: len(read_stamps(stamps_path)) >= n + 1, 30, interval=0.1)
        stamps = {i: v for i, v in read_stamps(stamps_path).items() if i >= 0}
    if len(stamps) < n:
        raise NotAvailableError(
            f"{n - len(stamps)} of {n} jobs had not started 30 s after the last"
        )
    # From the enqueue call (what a caller sees) and from its return (the
    # commit: what the queue's wake-up path alone costs).
    values = [(started - enqueued) * 1000 for enqueued, started in stamps.values()]
    pickup = [(stamps[i][1] - returned[i]) * 1000 for i in stamps]
    return {
        "latency_p50": percentile(values, 50),
        "latency_p95": percentile(values, 95),
        "latency_p99": percentile(values, 99),
        "latency_max": max(values),
        "pickup_p50": percentile(pickup, 50),
        "pickup_p99": percentile(pickup, 99),
    }


# -- worker RSS -----------------------------------------------------------------


def rss(ctx: Context, lib: Jobkeeper) -> dict[str, Any]:
    """Worker RSS while it drains ``sizes.rss`` no-op jobs: after warm-up (10 %
    done), at the end, the peak, and growth = end - warm-up.
    """
    import psutil

    n = ctx.sizes.rss
    warm_at = n // 10
    with ctx.fresh("jobkeeper_rss") as url:
        lib.prepare(url)
        started = time.perf_counter()
        lib.fill(url, n)
        ctx.analyze(lib, url)
        log(f"  {n:,} jobs enqueued in {time.perf_counter() - started:.0f}s")
        samples: list[tuple[float, int, int]] = []  # (t, done, rss bytes)
        with lib.probe(url) as probe:
            argv, env = lib.worker_command(url)
            worker = WorkerProcess(argv, env, ctx.log_path("jobkeeper-rss"))
            try:
                process = psutil.Process(worker.pid)
                last_count = 0.0
                done = 0
                deadline = worker.started + drain_timeout(n) * 2
                while True:
                    now = time.perf_counter()
                    if now - last_count >= 1.0:
                        done = n - probe.remaining()
                        last_count = now
                    samples.append((now - worker.started, done, process.memory_info().rss))
                    if done >= n:
                        break
                    if now > deadline:
                        raise NotAvailableError(
                            f"not drained after {deadline - worker.started:.0f}s"
                        )
                    worker.check_alive()
                    time.sleep(0.25)
            finally:
                worker.stop()
    warm = next((s for s in samples if s[1] >= warm_at), None)
    if warm is None:
        raise NotAvailableError("never reached warm-up")
    end = samples[-1]
    step = max(len(samples) // 200, 1)
    return {
        "rss_warm": warm[2] / MB,
        "rss_end": end[2] / MB,
        "rss_peak": max(s[2] for s in samples) / MB,
        "rss_growth": (end[2] - warm[2]) / MB,
        "rss_drain": n / end[0],
        "rss_series": [(round(t, 2), d, round(r / MB, 1)) for t, d, r in samples[::step]],
    }


# -- raw limit ------------------------------------------------------------------


def migrate_jobkeeper(url: str) -> None:
    from jobkeeper import JobQueue

    queue = JobQueue(url)
    try:
        queue.migrate()
    finally:
        queue.close()


def raw_limit(ctx: Context) -> dict[str, float]:
    """One run of the raw claim and drain figures on ``ctx.backend`` (the raw
    inserts are measured with the enqueues: benchmarks/turns.py)."""
    sizes = ctx.sizes
    out: dict[str, float] = {}
    pg = ctx.backend == "postgres"
    prepare = raw.pg_prepare if pg else raw.sqlite_prepare
    fill = raw.pg_fill if pg else raw.sqlite_fill
    clients_of = raw.pg_clients if pg else raw.sqlite_clients
    client_counts = sizes.raw_clients if pg else sizes.sqlite_raw_clients

    for batch in (1, sizes.raw_batch):
        jobs = sizes.raw_per_job if batch == 1 else sizes.raw_batched
        for clients in client_counts:
            with ctx.fresh(f"raw_life_b{batch}_c{clients}") as url:
                prepare(url)
                run = clients_of(url, "lifecycle", batch, clients, jobs)
                out[f"raw_lifecycle_b{batch}_c{clients}"] = run.done / run.seconds
            with ctx.fresh(f"raw_drain_b{batch}_c{clients}") as url:
                prepare(url)
                fill(url, jobs)
                run = clients_of(url, "drain", batch, clients, jobs)
                if run.done != jobs:
                    raise NotAvailableError(f"raw drain did {run.done} of {jobs} jobs")
                out[f"raw_drain_b{batch}_c{clients}"] = run.done / run.seconds
    return out
