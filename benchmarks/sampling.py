"""An extra, untimed drain of the jobkeeper worker under py-spy, and the
summary of where its Python time goes (the profile printed after the table).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    NotAvailableError,
    WorkerProcess,
    python_bin,
)
from benchmarks.libs import Jobkeeper
from benchmarks.measures import Context, drain_backlog

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
            rates = drain_backlog(ctx, lib, url, n, label="profile", on_progress=attach)
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
