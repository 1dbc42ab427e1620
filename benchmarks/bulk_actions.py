"""What a filtered ``jobkeeper cancel`` and ``retry`` of many live jobs cost.

Fills a fresh database with ``--jobs`` available jobs (default 50,000) of one
task in queue ``bulk``, enqueued a thousand at a time, then times, each as a
``jobkeeper`` subprocess, ``cancel --queue bulk --yes`` (every job
cancelled) and ``retry --queue bulk --yes`` (every cancelled job back to
available), and checks that every job ended where it should. ``--keyed``
gives each job a ``unique_key`` of its own (a retry must then look for a
pending holder of each key). Prints the seconds and the peak RSS of each
command; figures are never asserted.

    .venv/bin/python -m benchmarks.bulk_actions --backend sqlite
    .venv/bin/python -m benchmarks.bulk_actions --pg-url postgresql://postgres@127.0.0.1:5432/mine

``--src DIR`` runs the commands from another source tree (``PYTHONPATH``,
e.g. an older release unpacked with ``git archive``) to compare before and
after on the same machine. PostgreSQL gets a schema of its own on
``--pg-url`` (dropped after); SQLite a temporary file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.dashboard_pages import DEFAULT_PG_URL
from benchmarks.harness import scratch_database
from jobkeeper import JobQueue

#: The queue every job is in.
QUEUE = "bulk"
#: Jobs per enqueue_many.
CHUNK = 1_000


def fill(url: str, jobs: int, keyed: bool) -> None:
    with JobQueue(url) as jq:
        jq.migrate()
        for start in range(0, jobs, CHUNK):
            jq.enqueue_many(
                [
                    ("noop", {}, {"queue": QUEUE, "unique_key": f"k{n}" if keyed else None})
                    for n in range(start, min(start + CHUNK, jobs))
                ]
            )


def run_cli(url: str, src: Path | None, *argv: str) -> tuple[float, float, str]:
    """Seconds and peak RSS (MB) of ``jobkeeper --database URL argv...``, and its output."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "jobkeeper", "--database", url, *argv],
            env=env,
            stdout=out,
            stderr=err,
        )
        # wait4: this child's own peak RSS (KB on Linux), not the largest child's.
        _, status, usage = os.wait4(child.pid, 0)
        took = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode != 0:
            raise SystemExit(f"jobkeeper {' '.join(argv)} failed: {err.read()}")
        return took, usage.ru_maxrss / 1024, out.read().strip()


def counts(url: str) -> dict[str, int]:
    with JobQueue(url) as jq:
        return {status: n for status, n in jq.stats().get(QUEUE, {}).items() if n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--keyed", action="store_true", help="a unique_key per job")
    parser.add_argument("--src", type=Path, default=None, help="run the CLI from this src/")
    args = parser.parse_args()
    keyed = ", keyed" if args.keyed else ""
    print(f"{args.backend}: {args.jobs:,} jobs{keyed}, CLI from {args.src or 'this tree'}")
    with scratch_database(args.backend, args.pg_url) as url:
        fill(url, args.jobs, args.keyed)
        for action, after in (("cancel", "cancelled"), ("retry", "available")):
            took, peak, said = run_cli(url, args.src, action, "--queue", QUEUE, "--yes")
            left = counts(url)
            if left != {after: args.jobs}:
                raise SystemExit(f"{action} left {left}, not {args.jobs} {after} ({said})")
            rate = args.jobs / took
            print(f"  {action:<6} {took:7.2f} s  {rate:9,.0f} jobs/s  peak RSS {peak:5.0f} MB")


if __name__ == "__main__":
    main()
