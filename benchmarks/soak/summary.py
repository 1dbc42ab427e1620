"""The soak's printed summary, one line per thing it checks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from benchmarks.soak.config import SoakResult
from benchmarks.soak.history import percentile

#: The violations of :mod:`benchmarks.soak.requeue_checks`.
REQUEUE_KINDS = (
    "fence_reused",
    "fence_not_increasing",
    "final_row_mismatch",
    "requeue_lost",
    "dead_letter_accounting",
)


def mib(value: float) -> str:
    return f"{value / (1 << 20):+.1f} MiB"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def summarize(result: SoakResult, notes: Counter[str], refusals: list[str], out: Path) -> str:
    c = result.config
    s = result.report.stats
    by_status = ", ".join(f"{k} {v}" for k, v in s["by_status"].items())
    since_hb = s["rescue_after_last_heartbeat_s"]
    since_kill = s["rescue_after_kill_s"]
    fault_names = {
        "kill": "worker SIGKILL+restart",
        "stop": f"worker SIGSTOP {c.stop_for or 2 * c.rescue_after:g}s+SIGCONT",
        "terminate": "pg_terminate_backend",
        "pg_restart_fast": "PostgreSQL restart (fast)",
        "pg_crash_immediate": "PostgreSQL crash (stop -m immediate)",
        "pg_kill9": "PostgreSQL kill -9 postmaster",
        "pg_outage_long": f"PostgreSQL down {1.5 * c.rescue_after:g}s (> rescue_after)",
        "cut_both": f"host cut off both ways {c.stop_for or 2 * c.rescue_after:g}s",
        "cut_out": f"host's outgoing packets dropped {c.stop_for or 2 * c.rescue_after:g}s",
        "cut_in": f"host's incoming packets dropped {c.stop_for or 2 * c.rescue_after:g}s",
    }
    faults = ", ".join(f"{fault_names.get(k, k)} {v}" for k, v in sorted(result.faults.items()))
    probe = ""
    if result.probe:
        verdict = "DatabaseUnavailable" if result.probe.get("ok") else "FAILED"
        said = result.probe.get("message") or result.probe.get("detail")
        probe = (
            f"; probe against the stopped server: {verdict} after "
            f"{result.probe.get('seconds', 0):.1f}s: {said}"
        )
    lines = [
        f"jobkeeper chaos soak: {c.backend}, {c.workers} workers x {c.concurrency}, "
        f"{c.seconds:g}s of faults, heartbeat {c.heartbeat_interval:g}s, "
        f"rescue_after {c.rescue_after:g}s, seed {c.seed}"
        + (", each worker in a network namespace of its own" if c.partitions else ""),
        f"  jobs           {s['jobs']} enqueued ({c.jobs} chaos + 20 special + "
        f"{c.noop_jobs} no-op), {s['ambiguous_enqueues']} in refused enqueues; rows: {by_status}",
        f"  faults         {faults}"
        + (
            f" ({result.terminated_connections} connections terminated)"
            if result.terminated_connections
            else ""
        ),
        f"  enqueue down   {result.enqueue_refused} enqueue calls refused mid-run with "
        f"DatabaseUnavailable{probe}",
        f"  rescues        {s['rescues']} (+{s.get('free_returns', 0)} free returns of jobs "
        f"whose start mark was unwritten; holders: {result.rescued_holders['dead']} SIGKILLed, "
        f"{result.rescued_holders['stopped']} SIGSTOPped, {result.rescued_holders['cut']} cut off, "
        f"{result.rescued_holders['live']} live "
        f"(must be 0)); time-to-rescue after the holder's last heartbeat: "
        f"p50 {_secs(percentile(since_hb, 50))}, p99 {_secs(percentile(since_hb, 99))}, "
        f"max {_secs(max(since_hb, default=None))}; after SIGKILL: p50 "
        f"{_secs(percentile(since_kill, 50))}, p99 {_secs(percentile(since_kill, 99))}",
        f"  crash budget   {len(s.get('dead_for_faults', []))} jobs whose task succeeds dead "
        f"for crashes pinned on them in lone attempts, every one of them a worker the soak "
        f"killed, stopped or cut off {s.get('dead_for_faults', [])}",
        f"  duplicates     {s['duplicates']} overlapping live executions "
        f"({s['overlaps_justified']} overlaps after a holder was silent > rescue_after; "
        f"{s['started_after_rescue']} executions started after their claim was rescued)",
        f"  lost           {s['lost']}",
        _requeue_line(result),
        *_limits_lines(result),
        f"  executions     {s['executions']} logged, {s['executions_unfinished']} cut short by "
        f"SIGKILL, {s['re_executed_jobs']} jobs ran to success more than once",
    ]
    if result.rss.get("jobs"):
        warm = result.rss.get("warm_mib", {})
        end = result.rss.get("end_mib", {})
        per = ", ".join(f"{warm[p]:.1f}->{end.get(p, 0):.1f}" for p in sorted(warm))
        seconds = result.rss.get("seconds", 0)
        growth = mib(result.rss.get("max_growth", 0))
        lines.append(
            f"  worker RSS     {result.rss['jobs']} no-op jobs in {seconds:.1f}s: "
            f"max growth after warm-up {growth} (MiB per worker: {per})"
        )
    lines += [
        f"  workers        {result.worker_starts} starts, "
        f"{len(result.unexpected_exits)} unexpected exits, "
        f"{result.poison_kills} killed by the {result.config.poison_jobs} poison jobs, "
        f"final exit codes {sorted(result.exit_codes.values(), key=str)}",
        "  worker logs    "
        + (", ".join(f"{k} {v}" for k, v in sorted(notes.items())) or "nothing notable"),
        f"  checker        {'PASS' if result.report.ok else 'FAIL'} "
        f"({len(result.report.violations)} violations)",
    ]
    for violation in result.report.violations[:20]:
        lines.append(f"    {violation}")
    for problem in result.log_problems[:10]:
        lines.append(f"    log: {problem}")
    for exit_text in result.unexpected_exits[:3]:
        lines.append(f"    exit: {exit_text}")
    for error in result.enqueue_errors[:5]:
        lines.append(f"    enqueue: {error}")
    if refusals:
        lines.append(f"    first refusal: {refusals[0]}")
    lines.append(
        f"  result         {'PASS' if result.passed else 'FAIL'} in {result.elapsed:.0f}s"
        + "".join(f"\n    - {f}" for f in result.failures)
    )
    if c.keep or c.out:
        lines.append(f"  logs           {out}")
    return "\n".join(lines)


def _limits_lines(result: SoakResult) -> list[str]:
    c = result.config
    if not c.limits:
        return []
    s = result.report.stats
    most_starts, _ = s["most_starts_in_a_window"].get("bulk", (0, 0))
    return [
        f"  limits         bulk: concurrency {c.cap} (most running at once in the history: "
        f"{s['most_running'].get('bulk', 0)}), rate {c.rate_per_second}/s (most starts in a "
        f"1 s window: {most_starts}, reported only); serial keys: {s['serial_keys']} keys, "
        f"{s['serial_overlaps']} overlaps (must be 0); "
        f"{result.report.count('cap_exceeded')} cap excesses (must be 0)"
    ]


def _requeue_line(result: SoakResult) -> str:
    s = result.report.stats
    ways = result.requeues
    made = sum(w["jobs"] for w in ways.values())
    per_way = ", ".join(
        f"{way} {w['jobs']} in {w['calls']} calls: {w['confirmed']} confirmed, {w['maybe']} maybe"
        for way, w in ways.items()
    )
    return (
        f"  requeues       {made} made ({per_way}); {s.get('requeues_confirmed', 0)} "
        f"confirmed in all, {s.get('requeues_maybe', 0)} maybe, of "
        f"{s.get('requeued_jobs', 0)} jobs; fence and requeue violations: "
        f"{sum(result.report.count(k) for k in REQUEUE_KINDS)} (must be 0)"
    )
