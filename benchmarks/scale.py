"""jobkeeper's claim against a growing history of finished jobs: the time
and the buffers one claim of 10 takes at each size (the scale figures).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from benchmarks.harness import (
    NotAvailableError,
    connect_patiently,
    log,
    median,
    percentile,
    sqlite_connect,
)
from benchmarks.libs import Jobkeeper
from benchmarks.measures import Context, count_label

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
