"""Side by side: this checkout against an earlier commit, in one run.

    .venv/bin/python benchmarks/compare.py BASE_REV [--rounds 3] [run.py options...]
    .venv/bin/python benchmarks/compare.py HEAD~5 --only drain,latency --backend postgres --quick

Runs ``benchmarks/run.py`` alternately in this tree and in a checkout of
``BASE_REV`` (a detached worktree under ``.bench-baseline/``, with a
virtualenv of its own holding that revision's jobkeeper), ``--rounds``
times each, interleaved (base, head, base, head...) so that a machine that
drifts (another process, a warming cache) weighs on both alike. Peers are
left out (``--libs none``) and each round is one run (``--runs 1``); the
table shows every round's figure and the medians, head over base (for
jobs/s above 1 is faster, for the ms metrics such as ``enqueue_single_p99``
below 1 is faster). Every metric jobkeeper has in either side's JSON record
is shown; one that the base revision's ``run.py`` does not record yet (the
call latencies ``enqueue_single_p50``/``_p99`` and the ``enqueue_single_async``
figures, added later) is shown as n/a on that side, with no ratio.

A change that touches the hot path shows this table before and after
(what issue 12's "within noise of the commit before" asks for). Figures are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / ".bench-baseline"
RESULTS = "benchmarks/results"


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def baseline(rev: str) -> tuple[Path, str]:
    """A checkout of ``rev`` with its own virtualenv; made once, then reused."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = BASELINES / sha[:12]
    if not (tree / ".git").exists():
        BASELINES.mkdir(exist_ok=True)
        git("worktree", "add", "--detach", "--force", str(tree), sha)
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
        # run.py imports psycopg and psutil whatever it measures: the extras
        # this checkout's own .venv has (make bench installs .[dev,bench]).
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "-e", f"{tree}[postgres,bench]"],
            check=True,
        )  # fmt: skip
    return tree, sha


def one_run(tree: Path, python: Path, run_args: list[str]) -> dict[str, Any]:
    """One ``run.py`` in ``tree``; returns its JSON record."""
    before = set((tree / RESULTS).glob("*.json"))
    argv = [str(python), "benchmarks/run.py", "--libs", "none", "--runs", "1", *run_args]
    print(f"$ (cd {tree} && {' '.join(argv)})", flush=True)
    subprocess.run(argv, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    (record,) = set((tree / RESULTS).glob("*.json")) - before
    data: dict[str, Any] = json.loads(record.read_text())
    return data


def jobkeeper_figures(record: dict[str, Any]) -> dict[str, float]:
    """``{"postgres drain": jobs/s, ...}``: jobkeeper's figures of one record."""
    figures: dict[str, float] = {}
    for backend, libs in record["results"].items():
        for metric, value in libs.get("jobkeeper", {}).items():
            if isinstance(value, dict) and isinstance(value.get("median"), int | float):
                figures[f"{backend} {metric}"] = float(value["median"])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/compare.py", description=__doc__)
    parser.add_argument("base", help="the revision to compare against (e.g. HEAD~3, a sha)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (default 3)")
    args, run_args = parser.parse_known_args(argv)
    tree, sha = baseline(args.base)
    sides = {
        f"base {sha[:9]}": (tree, tree / ".venv" / "bin" / "python"),
        f"head {git('rev-parse', '--short=9', 'HEAD')}"
        + (" (+changes)" if git("status", "--porcelain", "--untracked-files=no") else ""): (
            ROOT,
            Path(sys.executable),
        ),
    }
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, (where, python) in sides.items():
            rounds[name].append(jobkeeper_figures(one_run(where, python, run_args)))
    metrics = sorted({m for runs in rounds.values() for figures in runs for m in figures})
    base_name, head_name = list(sides)
    print(f"\n{'metric':<44} {'side':<26} {'rounds':<40} {'median':>10}")
    for metric in metrics:
        medians: dict[str, float | None] = {}
        for name in sides:
            values = [r[metric] for r in rounds[name] if metric in r]
            medians[name] = statistics.median(values) if values else None
            if values:
                shown = " / ".join(f"{v:,.2f}" for v in values)
                print(f"{metric:<44} {name:<26} {shown:<40} {statistics.median(values):>10,.2f}")
            else:
                # A metric the other revision's run.py does not record (a
                # row added since), or a figure that was n/a in every round.
                print(f"{metric:<44} {name:<26} {'(not recorded)':<40} {'n/a':>10}")
        base_median, head_median = medians[base_name], medians[head_name]
        if base_median and head_median is not None:
            print(f"{'':<44} {'head / base':<26} {'':<40} "
                  f"{head_median / base_median:>10.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
