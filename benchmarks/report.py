"""Collects the figures of every run, prints the one table (medians, ratios,
n/a with reasons) and the targets of issue 3, and builds the JSON record.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any

from benchmarks.harness import median
from benchmarks.measures import Sizes, count_label

RAW = "raw"
SHORT = {"procrastinate": "procr", "pgqueuer": "pgq"}


@dataclass
class Results:
    """``values[backend][lib][metric]``: one figure per run; ``reasons``: why a
    figure is missing.
    """

    values: dict[str, dict[str, dict[str, list[float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    )
    reasons: dict[str, dict[str, dict[str, str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    extra: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )

    def add(self, backend: str, lib: str, figures: dict[str, Any]) -> None:
        for metric, value in figures.items():
            if isinstance(value, list):
                if value and isinstance(value[0], int | float):
                    self.values[backend][lib][metric].extend(value)
                else:
                    self.extra[backend][lib][metric] = value
            else:
                self.values[backend][lib][metric].append(float(value))

    def fail(self, backend: str, lib: str, metrics: list[str], reason: str) -> None:
        for metric in metrics:
            self.reasons[backend][lib].setdefault(metric, reason)

    def median(self, backend: str, lib: str, metric: str) -> float | None:
        runs = self.values.get(backend, {}).get(lib, {}).get(metric)
        return median(runs) if runs else None

    def reason(self, backend: str, lib: str, metric: str) -> str | None:
        known = self.reasons.get(backend, {}).get(lib, {})
        if metric in known:
            return known[metric]
        return next((r for pattern, r in known.items() if fnmatch(metric, pattern)), None)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for backend in sorted(set(self.values) | set(self.reasons)):
            libs: dict[str, Any] = {}
            names = set(self.values.get(backend, {})) | set(self.reasons.get(backend, {}))
            for lib in sorted(names):
                metrics: dict[str, Any] = {}
                for metric, runs in self.values.get(backend, {}).get(lib, {}).items():
                    metrics[metric] = {"median": median(runs), "runs": runs}
                for metric, reason in self.reasons.get(backend, {}).get(lib, {}).items():
                    metrics.setdefault(metric, {})["n/a"] = reason
                metrics.update(self.extra.get(backend, {}).get(lib, {}))
                libs[lib] = metrics
            out[backend] = libs
        return out


# -- derived raw references -----------------------------------------------------


def raw_references(results: Results, backend: str, sizes: Sizes) -> None:
    """Adds ``raw_bulk_best`` and ``raw_drain_best`` (the faster of multi-row
    INSERT and COPY; the best batched drain over the client counts) as
    single-run figures computed from the medians.
    """
    bulk = [
        m
        for m in (
            results.median(backend, RAW, "raw_insert_multirow"),
            results.median(backend, RAW, "raw_copy"),
        )
        if m is not None
    ]
    if bulk:
        results.values[backend][RAW]["raw_bulk_best"] = [max(bulk)]
    clients = sizes.raw_clients if backend == "postgres" else sizes.sqlite_raw_clients
    drains = {
        c: results.median(backend, RAW, f"raw_drain_b{sizes.raw_batch}_c{c}") for c in clients
    }
    best = max(((v, c) for c, v in drains.items() if v is not None), default=None)
    if best is not None:
        results.values[backend][RAW]["raw_drain_best"] = [best[0]]
        results.extra[backend][RAW]["raw_drain_best_clients"] = best[1]


# -- the table ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    metric: str
    label: str
    unit: str
    raw: str | None = None  # the raw-limit metric compared with this row
    libs: bool = True  # False: a raw-only row


def rows_for(backend: str, sizes: Sizes) -> list[Row]:
    n = count_label
    rows = [
        Row(
            "enqueue_single",
            f"enqueue, single ({sizes.single:,} calls)",
            "jobs/s",
            "raw_insert_single",
        ),
        Row("enqueue_single_p50", "  enqueue call p50", "ms"),
        Row("enqueue_single_p99", "  enqueue call p99", "ms"),
        Row(
            "enqueue_single_async",
            f"enqueue, single async ({sizes.single:,} awaited calls)",
            "jobs/s",
            "raw_insert_single",
        ),
        Row("enqueue_single_async_p50", "  enqueue call p50 (async)", "ms"),
        Row("enqueue_single_async_p99", "  enqueue call p99 (async)", "ms"),
        Row(
            "enqueue_bulk",
            f"enqueue, bulk ({sizes.bulk_batch:,}/call, {sizes.bulk:,} jobs)",
            "jobs/s",
            "raw_bulk_best",
        ),
        Row(
            "drain",
            f"drain {sizes.drain:,} no-op, 1 worker, c=10",
            "jobs/s",
            "raw_drain_best",
        ),
        Row("drain_steady", "  same, after the first jobs are done", "jobs/s", "raw_drain_best"),
        Row("drain_startup", "  worker start-up: spawn to first jobs done", "ms"),
        Row("latency_p50", f"latency p50 (idle, {sizes.latency_jobs} jobs 20 ms apart)", "ms"),
        Row("latency_p95", "latency p95", "ms"),
        Row("latency_p99", "latency p99", "ms"),
        Row("latency_max", "latency max", "ms"),
        Row("pickup_p50", "  pickup p50 (from enqueue return)", "ms"),
        Row("pickup_p99", "  pickup p99 (from enqueue return)", "ms"),
    ]
    for size in sizes.scale:
        rows.append(Row(f"claim_{n(size)}", f"claim 10, {n(size)} finished rows (median)", "ms"))
        if backend == "postgres":
            rows.append(Row(f"claim_{n(size)}_buffers", "  buffers touched per claim", "buf"))
            rows.append(Row(f"claim_{n(size)}_seq_scans", "  seq scans of the table", "scans"))
    if len(sizes.scale) > 1:
        rows.append(
            Row(
                "claim_ratio",
                f"claim @{n(sizes.scale[-1])} / @{n(sizes.scale[0])}",
                "x",
            )
        )
    rows += [
        Row("rss_warm", f"worker RSS after warm-up ({n(sizes.rss // 10)} jobs)", "MB"),
        Row("rss_end", f"worker RSS after {n(sizes.rss)} jobs", "MB"),
        Row("rss_growth", f"worker RSS growth over {n(sizes.rss)} jobs", "MB"),
        Row("rss_drain", f"  drain rate over those {n(sizes.rss)} jobs", "jobs/s"),
    ]
    sql = "SQL" if backend == "postgres" else "SQLite"
    rows.append(
        Row("raw_insert_single", f"raw {sql}: INSERT 1 row/statement", "jobs/s", libs=False)
    )
    if backend == "postgres":
        rows.append(
            Row(
                "raw_insert_multirow",
                f"raw SQL: multi-row INSERT, {sizes.bulk_batch:,}/stmt",
                "jobs/s",
                libs=False,
            )
        )
        rows.append(
            Row("raw_copy", f"raw SQL: COPY, {sizes.bulk_batch:,}/COPY", "jobs/s", libs=False)
        )
        rows.append(
            Row(
                "raw_copy_jobkeeper_table",
                f"  same, into jobkeeper's own table, {sizes.bulk_batch:,}/COPY",
                "jobs/s",
                libs=False,
            )
        )
    else:
        rows.append(
            Row(
                "raw_insert_multirow",
                f"raw SQLite: executemany, {sizes.bulk_batch:,}/txn",
                "jobs/s",
                libs=False,
            )
        )
    clients = sizes.raw_clients if backend == "postgres" else sizes.sqlite_raw_clients
    for kind, what in (("lifecycle", "insert+claim+complete"), ("drain", "claim+complete")):
        for batch in (1, sizes.raw_batch):
            for c in clients:
                per = "per job" if batch == 1 else f"batch {batch}"
                rows.append(
                    Row(
                        f"raw_{kind}_b{batch}_c{c}",
                        f"raw {sql}: {what}, {per}, {c} client{'s' if c > 1 else ''}",
                        "jobs/s",
                        libs=False,
                    )
                )
    return rows


def _format(value: float, unit: str) -> str:
    if unit == "jobs/s":
        return f"{value:,.0f}"
    if unit == "ms":
        return f"{value:.2f}" if value < 100 else f"{value:,.0f}"
    if unit == "MB":
        return f"{value:.1f}"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "buf":
        return f"{value:.1f}"
    if unit == "scans":
        return f"{value:.0f}"
    return f"{value:.3g}"


class Footnotes:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def mark(self, reason: str) -> str:
        if reason not in self.notes:
            self.notes.append(reason)
        return f"n/a[{self.notes.index(reason) + 1}]"


def derive_claim_ratio(results: Results, backend: str, sizes: Sizes) -> None:
    if len(sizes.scale) < 2:
        return
    first = results.median(backend, "jobkeeper", f"claim_{count_label(sizes.scale[0])}")
    last = results.median(backend, "jobkeeper", f"claim_{count_label(sizes.scale[-1])}")
    if first and last:
        results.values[backend]["jobkeeper"]["claim_ratio"] = [last / first]


def render(
    results: Results,
    backends: list[str],
    lib_names: list[str],
    sizes: Sizes,
    header: list[str],
) -> str:
    """The one table: a section per backend; cells are medians of the runs."""
    peers = [name for name in lib_names if name != "jobkeeper" and "postgres" in backends]
    columns = ["metric", "unit", "jobkeeper", *peers, "raw"]
    columns += [f"jk/{SHORT.get(p, p)}" for p in peers] + ["jk/raw"]
    notes = Footnotes()
    body: list[list[str]] = []
    for backend in backends:
        title = "PostgreSQL" if backend == "postgres" else "SQLite (jobkeeper only)"
        body.append([f"-- {title} --"] + [""] * (len(columns) - 1))
        for row in rows_for(backend, sizes):
            line = [row.label, row.unit]
            own = None
            for name in ["jobkeeper", *peers]:
                if not row.libs or (backend != "postgres" and name != "jobkeeper"):
                    line.append("")
                    continue
                value = results.median(backend, name, row.metric)
                if value is None:
                    reason = results.reason(backend, name, row.metric)
                    line.append(notes.mark(reason) if reason else "")
                else:
                    line.append(_format(value, row.unit))
                if name == "jobkeeper":
                    own = value
            raw_metric = row.metric if not row.libs else row.raw
            raw_value = results.median(backend, RAW, raw_metric) if raw_metric else None
            if raw_value is None and raw_metric:
                reason = results.reason(backend, RAW, raw_metric)
                line.append(notes.mark(reason) if reason else "")
            else:
                line.append(_format(raw_value, row.unit) if raw_value is not None else "")
            for name in peers:
                other = results.median(backend, name, row.metric) if row.libs else None
                line.append(f"{own / other:.2f}" if own is not None and other else "")
            line.append(
                f"{own / raw_value:.2f}" if own is not None and raw_value and row.libs else ""
            )
            body.append(line)
    widths = [max([len(columns[i]), *(len(r[i]) for r in body)]) for i in range(len(columns))]

    def fmt(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [
            c.rjust(w) if i != 0 else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells[1:], widths[1:], strict=True))
        ]
        return "  ".join([first, *rest]).rstrip()

    lines = [*header, fmt(columns), fmt(["-" * w for w in widths])]
    for r in body:
        lines.append(r[0] if r[0].startswith("-- ") else fmt(r))
    if notes.notes:
        lines.append("")
        lines += [f"n/a[{i + 1}]: {reason}" for i, reason in enumerate(notes.notes)]
    return "\n".join(lines)


# -- targets of issue 3 -----------------------------------------------------------


def targets(results: Results, sizes: Sizes, peers: list[str]) -> list[dict[str, Any]]:
    pg = "postgres"

    def jk(metric: str) -> float | None:
        return results.median(pg, "jobkeeper", metric)

    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, goal: str, met: bool | None, note: str = "") -> None:
        out.append(
            {
                "target": name,
                "value": value,
                "goal": goal,
                "met": met,
                "note": note,
            }
        )

    drain = jk("drain")
    peer_drains = {
        p: results.median(pg, p, "drain") for p in peers if results.median(pg, p, "drain")
    }
    if drain and peer_drains:
        fastest = max(peer_drains, key=lambda p: peer_drains[p])
        ratio = drain / peer_drains[fastest]
        add("drain >= 2x fastest Python peer", ratio, ">= 2.00", ratio >= 2, f"vs {fastest}")
    else:
        add("drain >= 2x fastest Python peer", None, ">= 2.00", None, "not measured")
    raw_drain = results.median(pg, RAW, "raw_drain_best")
    if drain and raw_drain:
        ratio = drain / raw_drain
        clients = results.extra.get(pg, {}).get(RAW, {}).get("raw_drain_best_clients")
        add(
            "drain >= 50% of batched raw SQL",
            ratio,
            ">= 0.50",
            ratio >= 0.5,
            f"raw: batch {sizes.raw_batch}, best of clients ({clients})",
        )
    else:
        add("drain >= 50% of batched raw SQL", None, ">= 0.50", None, "not measured")
    bulk, raw_bulk = jk("enqueue_bulk"), results.median(pg, RAW, "raw_bulk_best")
    if bulk and raw_bulk:
        ratio = bulk / raw_bulk
        add("bulk enqueue within 20% of raw INSERT/COPY", ratio, ">= 0.80", ratio >= 0.8)
    else:
        add("bulk enqueue within 20% of raw INSERT/COPY", None, ">= 0.80", None, "not measured")
    for metric, limit in (("latency_p50", 5.0), ("latency_p99", 25.0)):
        value = jk(metric)
        add(
            f"{metric.replace('_', ' ')} <= {limit:g} ms",
            value,
            f"<= {limit:g}",
            None if value is None else value <= limit,
        )
    ratio = jk("claim_ratio")
    largest = count_label(sizes.scale[-1])
    add(
        f"claim @{largest} within 20% of @10k",
        ratio,
        "<= 1.20",
        None if ratio is None else ratio <= 1.2,
        "" if sizes.scale[-1] >= 10_000_000 else "target is at 10M; this run stopped at " + largest,
    )
    growth = jk("rss_growth")
    add(
        "worker RSS growth <= 20 MB over 1M jobs",
        growth,
        "<= 20",
        None if growth is None else growth <= 20,
        "" if sizes.rss >= 1_000_000 else f"measured over {count_label(sizes.rss)} jobs only",
    )
    return out


def speed_targets(
    results: Results, sizes: Sizes, processes: dict[str, list[dict[str, float]]] | None
) -> list[dict[str, Any]]:
    """Issue 18's targets ("speed, round two"), from this run's medians:
    single and bulk enqueue against pgqueuer's and a COPY into jobkeeper's
    table, one worker against the 1-client batched raw drain, adding worker
    processes (benchmarks/processes.py), and SQLite's enqueue->start latency.
    """
    pg = "postgres"
    out: list[dict[str, Any]] = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    def add(name: str, value: float | None, goal: str, met: Any, note: str = "") -> None:
        met_or_none = None if value is None else bool(met(value))
        out.append({"target": name, "value": value, "goal": goal, "met": met_or_none, "note": note})

    def jk(metric: str, backend: str = pg) -> float | None:
        return results.median(backend, "jobkeeper", metric)

    def paired(metric: str, lib: str, other: str) -> float | None:
        """jobkeeper's ``metric`` over ``lib``'s ``other``: the median of the
        runs' ratios, as the enqueues took turns run by run (the ratio of the
        medians when a run lacks one of them)."""
        mine = results.values.get(pg, {}).get("jobkeeper", {}).get(metric) or []
        theirs = results.values.get(pg, {}).get(lib, {}).get(other) or []
        if mine and len(mine) == len(theirs) and all(theirs):
            return median([a / b for a, b in zip(mine, theirs, strict=True)])
        return ratio(jk(metric), results.median(pg, lib, other))

    turns = "median of the runs' ratios (the clients took turns)"
    add(
        "single enqueue >= 1.25x pgqueuer's rate",
        paired("enqueue_single", "pgqueuer", "enqueue_single"),
        ">= 1.25",
        lambda v: v >= 1.25,
        turns,
    )
    for kind, prefix in (("", "enqueue_single"), (" (async API)", "enqueue_single_async")):
        for q in ("p50", "p99"):
            add(
                f"single enqueue call {q}{kind} <= pgqueuer's",
                paired(f"{prefix}_{q}", "pgqueuer", f"enqueue_single_{q}"),
                "<= 1.00 (jk/pgqueuer)",
                lambda v: v <= 1.0,
                turns,
            )
    add(
        "bulk enqueue >= 1.5x pgqueuer",
        paired("enqueue_bulk", "pgqueuer", "enqueue_bulk"),
        ">= 1.50",
        lambda v: v >= 1.5,
        turns,
    )
    add(
        "bulk enqueue >= 0.8 of a COPY into jobkeeper's table",
        paired("enqueue_bulk", RAW, "raw_copy_jobkeeper_table"),
        ">= 0.80",
        lambda v: v >= 0.8,
        turns,
    )
    raw_drain = results.median(pg, RAW, f"raw_drain_b{sizes.raw_batch}_c1")
    add(
        "one worker >= 0.6 of the 1-client raw drain",
        ratio(jk("drain_steady"), raw_drain),
        ">= 0.60",
        lambda v: v >= 0.6,
        "both timed once working: the raw clients from their first claim, the worker "
        "after its first jobs are done",
    )
    steady = jk("drain_steady")
    # The start-up this line allows: the time 0.6 of the raw rate gives the
    # whole drain, less what the worker takes at its steady rate.
    budget = (
        (sizes.drain / (0.6 * raw_drain) - sizes.drain / steady) * 1000
        if raw_drain and steady
        else None
    )
    add(
        "  same, the worker's start-up included",
        ratio(jk("drain"), raw_drain),
        ">= 0.60",
        lambda v: v >= 0.6,
        f"start-up {jk('drain_startup') or 0:.0f} ms of the worker's drain"
        + (f", {budget:.0f} ms allowed at its steady rate" if budget is not None else "")
        + "; the raw clients' start-up is outside their time",
    )
    if processes:
        from benchmarks.processes import scaling_steps

        def floor(step: tuple[str, float, float]) -> float:
            # A step passes if it adds throughput, holds it (within 5 %), or
            # does no worse than the raw drain's same step (the database full).
            return min(0.95, 0.95 * step[2])

        worst = min(scaling_steps(processes), key=lambda s: s[1] - floor(s), default=None)
        add(
            "no drop as worker processes are added (until the database is saturated)",
            worst[1] if worst else None,
            ">= 0.95, or >= 0.95x the raw drain's same step",
            lambda v: worst is not None and v >= floor(worst),
            f"worst step {worst[0]}: raw x{worst[2]:.2f}" if worst else "",
        )
    else:
        add("no drop as worker processes are added", None, ">= 0.95", None, "not measured")
    for q, limit in (("p50", 3.0), ("p99", 10.0)):
        add(
            f"SQLite enqueue->start latency {q} <= {limit:g} ms",
            jk(f"latency_{q}", "sqlite"),
            f"<= {limit:g}",
            lambda v, limit=limit: v <= limit,
        )
    return out


def render_targets(
    items: list[dict[str, Any]],
    title: str = "targets of issue 3 (PostgreSQL, medians of this run):",
) -> str:
    lines = [title]
    for item in items:
        state = {True: "met", False: "NOT met", None: "n/a"}[item["met"]]
        value = "" if item["value"] is None else f"{item['value']:.2f}"
        note = f"  ({item['note']})" if item["note"] else ""
        lines.append(f"  {state:8} {item['target']}: {value} (goal {item['goal']}){note}")
    return "\n".join(lines)
