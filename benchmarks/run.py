"""jobkeeper's benchmark suite (issue 3): jobkeeper beside procrastinate,
pgqueuer and oban on one PostgreSQL server in one run, against the raw-SQL
limit; and jobkeeper on SQLite against a raw SQLite loop.

    .venv/bin/python benchmarks/run.py [--quick] [--backend postgres|sqlite|all]
                                       [--runs N] [--only NAME]... [--libs NAME,...]

Prints one table of medians (and ratios jobkeeper/peer and jobkeeper/raw) on
stdout, progress on stderr, and writes every figure to
benchmarks/results/<timestamp>.json. Nothing is asserted: see README.md.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import measures, processes, sampling, scale, turns
from benchmarks.harness import (
    DEFAULT_PG_URL,
    PG_URL_ENV,
    RESULTS_DIR,
    ROOT,
    NotAvailableError,
    PgServer,
    failure_reason,
    log,
)
from benchmarks.libs import Jobkeeper, Library, peers
from benchmarks.measures import FULL, QUICK, Context, Sizes
from benchmarks.report import (
    RAW,
    Results,
    derive_claim_ratio,
    raw_references,
    render,
    render_targets,
    speed_targets,
    targets,
)

MEASUREMENTS = ("enqueue", "drain", "latency", "raw", "processes", "scale", "rss", "profile")
BACKENDS = ("postgres", "sqlite")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="jobkeeper's benchmark suite: prints one table, writes a JSON record.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (minutes, not an hour)")
    parser.add_argument(
        "--backend",
        choices=(*BACKENDS, "all"),
        default="all",
        help="postgres (jobkeeper and peers), sqlite (jobkeeper only) or all (default)",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"measure only these (repeatable or comma-separated): {', '.join(MEASUREMENTS)}",
    )
    parser.add_argument(
        "--libs",
        default="",
        help="comma-separated peers to include (default: all of procrastinate,pgqueuer,oban)",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(PG_URL_ENV, DEFAULT_PG_URL),
        help=f"a database on the server to use (default ${PG_URL_ENV}, else {DEFAULT_PG_URL}); "
        "each measurement creates and drops a database of its own there",
    )
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the extra py-spy-profiled jobkeeper drain",
    )
    args = parser.parse_args(argv)
    only = {name.strip() for item in args.only for name in item.split(",") if name.strip()}
    unknown = only - set(MEASUREMENTS)
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}; choose from {', '.join(MEASUREMENTS)}")
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    args.selected = only or set(MEASUREMENTS)
    if args.no_profile and not only:
        args.selected.discard("profile")
    return args


def git_state() -> dict[str, Any]:
    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", *cmd], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "src"))}


class Suite:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes: Sizes = QUICK if args.quick else FULL
        self.results = Results()
        self.profile: dict[str, Any] | None = None
        #: benchmarks/processes.py's figures by configuration (None: not run),
        #: and its size: jobs per drain, rounds.
        self.processes: dict[str, list[dict[str, float]]] | None = None
        self.processes_size = (10_000, 1) if args.quick else (40_000, args.runs)
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.jobkeeper = Jobkeeper()
        wanted = {n.strip() for n in args.libs.split(",") if n.strip()}
        self.peers: list[Library] = [p for p in peers() if not wanted or p.name in wanted]
        self.backends = list(BACKENDS) if args.backend == "all" else [args.backend]
        self.server = PgServer(args.pg_url)
        self.workdir = Path(tempfile.mkdtemp(prefix="jkbench-"))
        self.load_start = os.getloadavg()

    # -- running ----------------------------------------------------------------

    def attempt(self, backend: str, lib: str, metrics: list[str], what: str, fn: Any) -> Any:
        started = time.perf_counter()
        try:
            figures = fn()
        except NotAvailableError as exc:
            log(f"{backend}/{lib}: {what}: n/a: {exc}")
            self.results.fail(backend, lib, metrics, str(exc))
            return None
        except Exception as exc:
            reason = failure_reason(exc)
            log(f"{backend}/{lib}: {what}: failed: {reason}")
            traceback.print_exc(file=sys.stderr)
            self.results.fail(backend, lib, metrics, reason)
            return None
        if figures is not None:
            self.results.add(backend, lib, figures)
            shown = {k: round(v, 2) for k, v in figures.items() if isinstance(v, int | float)}
            log(f"{backend}/{lib}: {what}: {shown} ({time.perf_counter() - started:.1f}s)")
        return figures

    def enqueues(self, backend: str, ctx: Context, libs: list[Library]) -> None:
        """One run of every enqueue figure and of the raw inserts beside them,
        the clients taking turns (benchmarks/turns.py): the single enqueues,
        then the bulk ones.
        """

        def fail(lib: str, metrics: list[str], reason: str) -> None:
            log(f"{backend}/{lib}: {metrics[0]}: n/a: {reason}")
            self.results.fail(backend, lib, metrics, reason)

        for lib in libs:
            if lib.unavailable:
                fail(lib.name, ["enqueue_*"], lib.unavailable)
        for what, rotation in (("single", turns.singles), ("bulk", turns.bulks)):
            started = time.perf_counter()
            figures = rotation(ctx, libs, fail)
            for name, values in figures.items():
                self.results.add(backend, name, values)
                shown = {k: round(v, 2) for k, v in values.items()}
                log(f"{backend}/{name}: enqueue {what}, taking turns: {shown}")
            log(f"{backend}: {what} enqueues took {time.perf_counter() - started:.1f}s")

    def run(self) -> int:
        selected = self.args.selected
        precompile()
        if "postgres" in self.backends:
            try:
                self.server.drop_stale()
                self.server_info = self.server.describe()
            except Exception as exc:
                log(f"PostgreSQL at {self.args.pg_url} is unavailable: {exc}")
                for lib in [self.jobkeeper.name, *[p.name for p in self.peers], RAW]:
                    self.results.fail("postgres", lib, ["*"], f"PostgreSQL unavailable: {exc}")
                self.backends.remove("postgres")
                self.server_info = {"error": str(exc)}
        try:
            for backend in self.backends:
                self.run_backend(backend, selected)
        finally:
            self.server.drop_all()
        return self.finish()

    def run_backend(self, backend: str, selected: set[str]) -> None:
        ctx = Context(
            backend=backend,
            sizes=self.sizes,
            runs=self.args.runs,
            workdir=self.workdir,
            server=self.server if backend == "postgres" else None,
        )
        libs: list[Library] = [self.jobkeeper]
        if backend == "postgres":
            for peer in self.peers:
                peer.setup()  # oban: makes or updates .venv-oban (Python >= 3.12)
            libs += self.peers
        for lib in libs:
            if lib.unavailable:
                log(f"{lib.name}: n/a: {lib.unavailable}")
        per_lib = [
            ("drain", ["drain", "drain_steady", "drain_startup"], "drain", measures.drain),
            (
                "latency",
                [
                    "latency_p50",
                    "latency_p95",
                    "latency_p99",
                    "latency_max",
                    "pickup_p50",
                    "pickup_p99",
                ],
                "latency",
                measures.latency,
            ),
        ]
        # Runs are interleaved (run 1 of every library, then run 2, ...) so
        # that drift on the shared machine spreads over all of them.
        for run in range(self.args.runs):
            log(f"== {backend}: run {run + 1} of {self.args.runs} ==")
            if "enqueue" in selected:
                self.enqueues(backend, ctx, libs)
            for name, metrics, what, fn in per_lib:
                if name not in selected:
                    continue
                for lib in libs:
                    if lib.unavailable:
                        self.results.fail(backend, lib.name, metrics, lib.unavailable)
                        continue
                    self.attempt(
                        backend, lib.name, metrics, what, lambda fn=fn, lib=lib: fn(ctx, lib)
                    )
            if "raw" in selected:
                self.attempt(backend, RAW, ["raw_*"], "raw limit", lambda: measures.raw_limit(ctx))
        # Before scale and RSS: their 10M-row fill and 1M-job drain leave the
        # server writing back dirty pages for minutes, which slows any drain
        # measured meanwhile.
        if "processes" in selected and backend == "postgres":
            try:
                self.processes = processes.measure(self.server, *self.processes_size)
            except Exception as exc:
                log(f"processes: failed: {type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
        if "scale" in selected:
            sizes = [f"claim_{measures.count_label(n)}" for n in self.sizes.scale]
            self.attempt(
                backend,
                "jobkeeper",
                sizes,
                "scale",
                lambda: scale.scale(ctx, self.jobkeeper),
            )
        if "rss" in selected:
            self.attempt(
                backend,
                "jobkeeper",
                ["rss_warm", "rss_end", "rss_growth", "rss_drain"],
                "worker RSS",
                lambda: measures.rss(ctx, self.jobkeeper),
            )
        if "profile" in selected and backend == "postgres":
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            output = RESULTS_DIR / f"{self.stamp}-jobkeeper-drain.pyspy.txt"
            try:
                self.profile = sampling.profile_drain(ctx, self.jobkeeper, output)
            except Exception as exc:
                log(f"profile: n/a: {exc}")
                self.profile = {"n/a": f"{type(exc).__name__}: {exc}"}
        raw_references(self.results, backend, self.sizes)
        derive_claim_ratio(self.results, backend, self.sizes)

    # -- reporting -------------------------------------------------------------

    def header(self) -> list[str]:
        mode = "quick" if self.args.quick else "full"
        info = getattr(self, "server_info", {})
        version = info.get("settings", {}).get("server_version", "?")
        settings = info.get("settings", {})
        lines = [
            f"jobkeeper benchmark ({mode}) {self.stamp}: {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, medians of {self.args.runs} run(s); "
            f"load average at start {self.load_start[0]:.1f}, at end {os.getloadavg()[0]:.1f}",
        ]
        if "postgres" in self.backends:
            lines.append(
                f"PostgreSQL {version} at {info.get('host')}:{info.get('port')} "
                f"(synchronous_commit={settings.get('synchronous_commit')}, "
                f"autovacuum={settings.get('autovacuum')}, "
                f"shared_buffers={settings.get('shared_buffers')}); "
                "each measurement in a fresh database"
            )
        if "sqlite" in self.backends:
            lines.append(f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL) in a temp dir")
        shown = [self.jobkeeper, *self.peers] if "postgres" in self.backends else [self.jobkeeper]
        for lib in shown:
            state = f"n/a: {lib.unavailable}" if lib.unavailable else lib.worker_settings
            lines.append(f"  {lib.name} {lib.version or '-'}: {state}")
        lines.append(
            f"enqueues and the raw inserts: the clients take turns, {turns.SINGLE_BLOCK} single "
            f"calls or {turns.BULK_BLOCK} bulk call each, round after round (benchmarks/turns.py)"
        )
        lines.append(
            "scale and RSS: one fill each (scale: median of each run's median claim time); "
            "jk/x = jobkeeper / x (for ms and MB rows lower is better)"
        )
        lines.append("")
        return lines

    def finish(self) -> int:
        lib_names = ["jobkeeper", *[p.name for p in self.peers]]
        table = render(self.results, self.backends, lib_names, self.sizes, self.header())
        goal = targets(self.results, self.sizes, [p.name for p in self.peers])
        speed = speed_targets(self.results, self.sizes, self.processes)
        goals_text = render_targets(goal) if "postgres" in self.backends else ""
        print(table)
        if self.processes:
            print()
            print(processes.render(self.processes, *self.processes_size))
        if goals_text:
            print()
            print(goals_text)
            print()
            print(render_targets(speed, "targets of issue 18 (medians of this run):"))
        if self.profile:
            print()
            print(render_profile(self.profile))
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.stamp}.json"
        record = {
            "meta": {
                "timestamp": self.stamp,
                "mode": "quick" if self.args.quick else "full",
                "runs": self.args.runs,
                "cores": os.cpu_count(),
                "load_average": {"start": self.load_start, "end": os.getloadavg()},
                "python": platform.python_version(),
                "platform": platform.platform(),
                "jobkeeper_git": git_state(),
                "postgres": getattr(self, "server_info", None),
                "sqlite": sqlite3.sqlite_version,
                "libraries": {
                    lib.name: {
                        "version": lib.version,
                        "worker": lib.worker_settings,
                        "n/a": lib.unavailable,
                    }
                    for lib in [self.jobkeeper, *self.peers]
                },
                "command": [sys.executable, *sys.argv],
                "worker_logs": str(self.workdir),
            },
            "sizes": self.sizes.__dict__,
            "results": self.results.as_json(),
            "targets": goal,
            "speed_targets": speed,
            "processes": self.processes,
            "profile": self.profile,
            "table": table,
        }
        path.write_text(json.dumps(record, indent=2, default=str))
        print(f"\nfigures written to {path.relative_to(ROOT)}")
        return 0


def render_profile(profile: dict[str, Any]) -> str:
    if "n/a" in profile:
        return f"profile of the jobkeeper worker during a drain: n/a: {profile['n/a']}"
    busy = profile.get("gil_busy")
    lines = [
        "py-spy --gil profile of the jobkeeper worker during an extra, untimed drain",
        f"  {profile['samples']} samples in {profile['seconds']:.1f}s: the GIL was held "
        f"{'?' if busy is None else f'{100 * busy:.0f}%'} of the time; drain under the "
        f"profiler {profile['drain_under_profiler']:,.0f} jobs/s; stacks: {profile['file']}",
        "  GIL-holding samples per thread:",
    ]
    lines += [f"    {share:5.1f}%  {name}" for name, share in profile["threads"][:8]]
    lines.append("  top functions by own time:")
    lines += [f"    {share:5.1f}%  {name}" for name, share in profile["own"][:12]]
    lines.append("  top jobkeeper functions by inclusive time:")
    lines += [f"    {share:5.1f}%  {name}" for name, share in profile["inclusive"][:12]]
    return "\n".join(lines)


def precompile() -> None:
    """Write the bytecode of jobkeeper (an editable install: its modules are
    the files in src/) and of the benchmark apps every worker imports.

    With PYTHONDONTWRITEBYTECODE set, as on the CI machines, Python would
    otherwise compile them again at every worker start (about 50 ms of the
    worker's start-up, inside the drain figure), which an installed wheel,
    compiled by pip like the peers', never does.
    """
    for directory in (ROOT / "src" / "jobkeeper", ROOT / "benchmarks"):
        compileall.compile_dir(directory, quiet=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return Suite(args).run()


if __name__ == "__main__":
    sys.exit(main())
