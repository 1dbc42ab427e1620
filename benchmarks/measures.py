"""The measurements. Each function measures one thing once, in a database of
its own created for it, and returns ``{metric: value}``; it raises
:class:`NotAvailableError` (or anything else) when the figure cannot be had, and
the caller records the reason instead of a number.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
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
    connect_patiently,
    fresh_sqlite,
    log,
    median,
    percentile,
    python_bin,
    read_stamps,
    sqlite_connect,
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


def _drain(
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
        return _drain(ctx, lib, url, n, label="drain")


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


# -- scale (jobkeeper's claim against a growing history) ------------------------

PG_FILL_HISTORY = """
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, attempt, scheduled_at, created_at, attempted_at, finished_at)
SELECT 'default', 'noop', '{}', CASE WHEN g %% 20 = 0 THEN 'cancelled' ELSE 'completed' END,
       1, now(), now(), now(), now()
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""
PG_FILL_DEAD = """
INSERT INTO jobkeeper_dead_letters
    (id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
     attempted_at, finished_at, errors, reason)
SELECT 1000000000000 + g, 'default', 'noop', '{}', 0, 20, 20, now(), now(), now(), now(),
       '[]', 'max_attempts exhausted'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""
SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
SQLITE_FILL_HISTORY = f"""
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, attempt, scheduled_at, created_at, attempted_at, finished_at)
WITH RECURSIVE g(x) AS (SELECT :first UNION ALL SELECT x + 1 FROM g WHERE x < :last)
SELECT 'default', 'noop', '{{}}', CASE WHEN x % 20 = 0 THEN 'cancelled' ELSE 'completed' END,
       1, {SQLITE_NOW}, {SQLITE_NOW}, {SQLITE_NOW}, {SQLITE_NOW}
FROM g
"""
SQLITE_FILL_DEAD = f"""
INSERT INTO jobkeeper_dead_letters
    (id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
     attempted_at, finished_at, errors, reason)
WITH RECURSIVE g(x) AS (SELECT :first UNION ALL SELECT x + 1 FROM g WHERE x < :last)
SELECT 1000000000000 + x, 'default', 'noop', '{{}}', 0, 20, 20, {SQLITE_NOW}, {SQLITE_NOW},
       {SQLITE_NOW}, {SQLITE_NOW}, '[]', 'max_attempts exhausted'
FROM g
"""
FILL_CHUNK = 1_000_000


def _fill_history(ctx: Context, url: str, n: int) -> None:
    """``n`` completed (95 %) and cancelled (5 %) rows in the jobs table, and
    ``n / 20`` dead letters, then VACUUM ANALYZE (autovacuum may be off).
    """
    dead = max(n // 20, 1)
    if ctx.backend == "sqlite":
        conn = sqlite_connect(url)
        try:
            for query, total in ((SQLITE_FILL_HISTORY, n), (SQLITE_FILL_DEAD, dead)):
                for first in range(1, total + 1, FILL_CHUNK):
                    last = min(first + FILL_CHUNK - 1, total)
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(query, {"first": first, "last": last})
                    conn.execute("COMMIT")
            conn.execute("ANALYZE")
        finally:
            conn.close()
        return

    with connect_patiently(url) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '256MB'")
        for query, total in ((PG_FILL_HISTORY, n), (PG_FILL_DEAD, dead)):
            for first in range(1, total + 1, FILL_CHUNK):
                last = min(first + FILL_CHUNK - 1, total)
                conn.execute(query, {"first": first, "last": last})
                if total > FILL_CHUNK:
                    log(f"  filled {last:,} of {total:,}")
        conn.execute("VACUUM ANALYZE jobkeeper_jobs")
        conn.execute("VACUUM ANALYZE jobkeeper_dead_letters")


def scale(ctx: Context, lib: Jobkeeper) -> dict[str, list[float]]:
    """For each history size: the median time of ``jq.backend.job_claim`` (limit
    10) over ``scale_claims`` calls per run. Every size is filled first, each
    in its own database; then the runs go round the sizes (run 1 of every
    size, then run 2, ...) so that drift on the machine spreads over all of
    them. Returns ``{metric: [per-run medians]}`` plus plan statistics.
    """
    sizes = ctx.sizes
    warm_up = 20
    claims = warm_up + sizes.scale_claims
    out: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        urls: dict[int, str] = {}
        before: dict[int, dict[str, Any] | None] = {}
        for n in sizes.scale:
            url = stack.enter_context(ctx.fresh(f"jobkeeper_scale_{count_label(n)}"))
            started = time.perf_counter()
            lib.prepare(url)
            _fill_history(ctx, url, n)
            lib.fill(url, (ctx.runs * claims + 10) * sizes.scale_limit)
            ctx.analyze(lib, url)
            log(f"  {count_label(n)} finished rows ready in {time.perf_counter() - started:.0f}s")
            urls[n] = url
        for n, url in urls.items():
            before[n] = _claim_stats(ctx, url, wait=n == sizes.scale[0])
        for _ in range(ctx.runs):
            for n, url in urls.items():
                metric = f"claim_{count_label(n)}"
                queue = lib._queue(url)
                try:
                    backend = queue.backend
                    times = []
                    for i in range(claims):
                        t0 = time.perf_counter()
                        jobs = backend.job_claim(
                            worker_id="bench-scale", queue="default", limit=sizes.scale_limit
                        )
                        if i >= warm_up:  # the first: pool, plan cache, buffers
                            times.append((time.perf_counter() - t0) * 1000)
                        if len(jobs) != sizes.scale_limit:
                            raise NotAvailableError(f"a claim returned {len(jobs)} jobs")
                finally:
                    queue.close()  # its sessions end: their statistics are flushed
                out.setdefault(metric, []).append(median(times))
                out.setdefault(f"{metric}_p95", []).append(percentile(times, 95))
        for n, url in urls.items():
            after = _claim_stats(ctx, url, wait=n == sizes.scale[0])
            first = before[n]
            if first is None or after is None:
                continue
            metric = f"claim_{count_label(n)}"
            total = ctx.runs * claims
            scans = {
                index: after["indexes"].get(index, 0) - count
                for index, count in first["indexes"].items()
                if after["indexes"].get(index, 0) - count
            }
            seq = after["seq_scan"] - first["seq_scan"]
            per_claim = (after["buffers"] - first["buffers"]) / total
            out[f"{metric}_buffers"] = [per_claim]
            out[f"{metric}_seq_scans"] = [float(seq)]
            out[f"{metric}_plan"] = [f"{total} claims: index scans {scans}"]
            log(
                f"  claims @{count_label(n)}: {scans} index scans, {seq} seq scans, "
                f"{per_claim:.1f} buffers per claim"
            )
    return out


def _claim_stats(ctx: Context, url: str, *, wait: bool = False) -> dict[str, Any] | None:
    """PostgreSQL's cumulative statistics of jobkeeper_jobs: sequential scans,
    scans per index, buffers touched (heap + indexes). Their differences
    around the claims show which plan the claim used, without EXPLAIN.
    """
    if ctx.backend != "postgres":
        return None

    if wait:
        time.sleep(1.0)  # ended sessions flush their statistics on exit
    with connect_patiently(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT seq_scan, coalesce(heap_blks_read, 0) + coalesce(heap_blks_hit, 0) "
            "+ coalesce(idx_blks_read, 0) + coalesce(idx_blks_hit, 0) "
            "FROM pg_stat_user_tables JOIN pg_statio_user_tables USING (relid) "
            "WHERE pg_stat_user_tables.relname = 'jobkeeper_jobs'"
        ).fetchone()
        indexes = dict(
            conn.execute(
                "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes "
                "WHERE relname = 'jobkeeper_jobs'"
            ).fetchall()
        )
    if row is None:
        return None
    return {"seq_scan": row[0], "buffers": row[1], "indexes": indexes}


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


# -- profile --------------------------------------------------------------------


#: Backlog of the profiled drain: long enough for thousands of samples.
PROFILE_JOBS = 20_000
#: py-spy samples per second.
PROFILE_RATE = 250


def profile_drain(ctx: Context, lib: Jobkeeper, output: Path) -> dict[str, Any]:
    """An extra, untimed drain of the jobkeeper worker under ``py-spy record``
    (``--gil``: only the thread holding the GIL is sampled, so the samples
    are where the worker spends Python CPU time; raw collapsed stacks, per
    thread), attached once the first jobs are done so that start-up is left
    out. Returns a summary: the share of time the GIL was held, samples per
    thread, top functions by own and by inclusive time.
    """
    spy = shutil.which("py-spy") or python_bin("py-spy")
    if not Path(spy).exists() and shutil.which(spy) is None:
        raise NotAvailableError("py-spy is not installed (pip install -e '.[bench]')")
    n = max(ctx.sizes.drain, PROFILE_JOBS)
    recorder: dict[str, subprocess.Popen[bytes]] = {}
    spy_log = ctx.log_path("py-spy")

    attached: list[float] = []

    def attach(worker: WorkerProcess) -> None:
        attached.append(time.perf_counter())
        recorder["proc"] = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(worker.pid),
                "--output",
                str(output),
                "--format",
                "raw",
                "--threads",
                "--gil",
                "--rate",
                str(PROFILE_RATE),
                "--nonblocking",
            ],
            stdout=spy_log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    with ctx.fresh("jobkeeper_profile") as url:
        lib.prepare(url)
        lib.fill(url, n)
        ctx.analyze(lib, url)
        try:
            rates = _drain(ctx, lib, url, n, label="profile", on_progress=attach)
            recorded = time.perf_counter() - attached[0] if attached else 0.0
        finally:
            if "proc" in recorder:
                try:
                    recorder["proc"].wait(30)
                except subprocess.TimeoutExpired:
                    recorder["proc"].kill()
    if not output.exists():
        raise NotAvailableError(
            f"py-spy wrote no profile ({spy_log.read_text(errors='replace')[-300:]})"
        )
    summary = summarize(output)
    spy_says = [
        line for line in spy_log.read_text(errors="replace").splitlines() if "Samples" in line
    ]
    return {
        "py_spy": spy_says[-1].strip() if spy_says else "",
        "file": str(output),
        "drain_under_profiler": rates["drain_steady"],
        "seconds": recorded,
        "gil_busy": summary["samples"] / (PROFILE_RATE * recorded) if recorded else None,
        **summary,
    }


def _short(frame: str, *, line: bool = True) -> str:
    """``func (path/to/pkg/module.py:12)`` -> ``func (pkg/module.py:12)``
    (without ``:12`` when not ``line``).
    """
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    path = where.rstrip(")")
    if not line:
        path = path.rsplit(":", 1)[0]
    for marker in ("site-packages/", "src/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return (
        f"{name} ({path.rsplit('/', 2)[-2] + '/' if '/' in path else ''}{path.rsplit('/', 1)[-1]})"
    )


def _in_jobkeeper(frame: str) -> bool:
    """A frame of jobkeeper's own code below the CLI (the inclusive view)."""
    where = frame.partition(" (")[2]
    return "jobkeeper/" in where and "/cli/" not in where and "/api.py" not in where


def summarize(path: Path, top: int = 15) -> dict[str, Any]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), frames[0])
        code = [f for f in frames if not f.startswith(("thread ", "process "))]
        total += count
        threads[thread] += count
        if code:
            own[_short(code[-1])] += count
        for frame in {_short(f, line=False) for f in code if _in_jobkeeper(f)}:
            inclusive[frame] += count

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * c / total, 1)) for name, c in counter.most_common(top)]

    return {
        "samples": total,
        "threads": share(threads),
        "own": share(own),
        "inclusive": share(inclusive),
    }
