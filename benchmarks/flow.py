"""What flow control costs, and whether limited queues reach their limits.

1. The no-op drain of an unlimited queue, before (the code at ``--base``, a
   git revision checked out in a detached worktree) and after (this
   checkout), in the same run, rounds interleaved: each round drains ``--jobs``
   no-op jobs with one in-process burst worker on a fresh schema, for each
   side in turn. The "before" side runs with ``PYTHONPATH`` at the other
   worktree's ``src`` (ahead of this checkout's editable install).
2. A ``concurrency=50`` queue across four worker processes (concurrency 20
   each, 0.1 s and 0.5 s jobs: at most 500 and 100 jobs/s allowed), and a rate-limited queue
   (``--rate``, four workers): jobs/s reached against the allowed rate.
3. Serial keys: 22,000 no-op jobs drained by two worker processes, none
   keyed, one in ten keyed over 50 keys, all keyed over 50 keys (deep keys)
   and all keyed over 5,000 keys (shallow ones): jobs/s.

    .venv/bin/python -m benchmarks.flow --jobs 3000 --rounds 3
    .venv/bin/python -m benchmarks.flow --parts capped --rounds 3   # part 2's cap only

``--parts`` picks among ``drain``, ``capped``, ``rated`` and ``serial`` (all by default);
``--rounds`` repeats the capped and rated runs too. Bench schemas are named
``$JOBKEEPER_BENCH_SCHEMA_PREFIX`` (``jk_bench_flow_``) plus a random suffix,
for a shared server where each user keeps to a prefix of their own.

Figures are printed, never asserted. PostgreSQL only (the limits' locking is
what is at stake there); the URL comes from ``$JOBKEEPER_BENCH_PG_URL``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from urllib.parse import quote

import psycopg

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("JOBKEEPER_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")

DRAIN = """
import sys, time
from jobkeeper import JobQueue
jq = JobQueue(sys.argv[1], poll_interval=0.05)
jq.migrate()
@jq.task()
def noop() -> None: ...
n = int(sys.argv[2])
for start in range(0, n, 1000):
    jq.enqueue_many([("noop", {})] * min(1000, n - start))
began = time.perf_counter()
jq.run_worker(concurrency=10, burst=True)
print(n / (time.perf_counter() - began))
"""

FLOW_APP = """
import os, time
from jobkeeper import JobQueue
jq = JobQueue(os.environ["JK_URL"], poll_interval=0.05, heartbeat_interval=0.5)
@jq.task()
def nap(seconds: float) -> None:
    time.sleep(seconds)
"""


def schema_url(schema: str) -> str:
    separator = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{separator}options={quote(f'-csearch_path={schema}')}"


class Schema:
    def __init__(self) -> None:
        prefix = os.environ.get("JOBKEEPER_BENCH_SCHEMA_PREFIX", "jk_bench_flow_")
        self.name = f"{prefix}{secrets.token_hex(4)}"

    def __enter__(self) -> str:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.name}"')
        return schema_url(self.name)

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{self.name}" CASCADE')


def drain(src: Path, jobs: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    with Schema() as url:
        out = subprocess.run(
            [sys.executable, "-c", DRAIN, url, str(jobs)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(out.stdout.strip().splitlines()[-1])


def base_worktree(revision: str) -> Path:
    # One per checkout: two checkouts benchmarking at once must not move
    # each other's "before" side.
    tag = f"{os.getuid()}-{zlib.crc32(str(ROOT).encode()):08x}"
    path = Path(tempfile.gettempdir()) / f"jobkeeper-bench-flow-base-{tag}"
    if path.exists():
        subprocess.run(["git", "-C", str(path), "checkout", "-q", "--detach", revision], check=True)
    else:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), revision],
            check=True,
        )
    return path / "src"


def limited(
    setting: dict[str, object],
    *,
    jobs: int,
    seconds: float,
    period: float = 0.0,
    keyed_every: int = 0,
    keys: int = 50,
    workers: int = 4,
) -> float:
    """Jobs/s ``workers`` worker processes reach on a queue with ``setting``:
    jobs over the time from the first start to the last finish (from the
    jobs' rows), plus ``period``: a rate limit lets a window's worth start at
    once, so N jobs need (N / rate - 1) periods, not N / rate. Every
    ``keyed_every``-th job (none when 0) has a serial key, one of ``keys``
    in turn.
    """
    with Schema() as url, tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "flow_bench_app.py").write_text(FLOW_APP)
        env = dict(os.environ, JK_URL=url, PYTHONPATH=f"{tmp}{os.pathsep}{ROOT / 'src'}")
        sys.path.insert(0, str(ROOT / "src"))
        from jobkeeper import JobQueue

        jq = JobQueue(url)
        jq.migrate()
        if setting:
            jq.configure_queue("default", **setting)  # type: ignore[arg-type]
        batch = [
            ("nap", {"seconds": seconds}, {"serial_key": f"k{i // keyed_every % keys}"})
            if keyed_every and i % keyed_every == 0
            else ("nap", {"seconds": seconds})
            for i in range(jobs)
        ]
        for start in range(0, jobs, 1000):
            jq.enqueue_many(batch[start : start + 1000])
        argv = [sys.executable, "-m", "jobkeeper", "--database", url, "worker"]
        argv += ["--app", "flow_bench_app:jq", "--concurrency", "20", "--burst"]
        processes = [
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(workers)
        ]
        for process in processes:
            process.wait(timeout=600)
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM max(finished_at) - min(attempted_at)) "
                "FROM jobkeeper_jobs WHERE status = 'completed'"
            ).fetchone()
        jq.close()
    assert row is not None
    done, span = int(row[0]), float(row[1])
    return done / (span + period)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default="main", help="the 'before' revision")
    parser.add_argument("--rate", default="100/s")
    parser.add_argument(
        "--parts",
        default="drain,capped,rated,serial",
        help="comma-separated: drain (part 1), capped and rated (part 2), serial (part 3)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    if "drain" in parts:
        base_src = base_worktree(args.base)
        before: list[float] = []
        after: list[float] = []
        for round_no in range(args.rounds):
            for side, src, into in (("before", base_src, before), ("after", ROOT / "src", after)):
                rate = drain(src, args.jobs)
                into.append(rate)
                print(f"round {round_no + 1} {side}: {rate:8.0f} jobs/s", flush=True)
        b, a = statistics.median(before), statistics.median(after)
        print(f"no-op drain, unlimited queue: before {b:.0f}, after {a:.0f} jobs/s ({a / b:.1%})")

    # The cap counts jobs held in the database, so each slot is also held
    # for its claim and its completion's write: short jobs show that cost.
    if "capped" in parts:
        for seconds in (0.1, 0.5):
            allowed = 50 / seconds
            shares = []
            for _ in range(args.rounds):
                reached = limited({"concurrency": 50}, jobs=int(allowed * 10), seconds=seconds)
                shares.append(reached / allowed)
                print(
                    f"concurrency=50, 4 workers x 20, {seconds} s jobs: {reached:.0f} jobs/s "
                    f"of {allowed:.0f} ({reached / allowed:.1%})",
                    flush=True,
                )
            print(f"  median {statistics.median(shares):.1%}", flush=True)
    if "rated" in parts:
        count, unit = args.rate.split("/")
        per_second = int(count) / {"s": 1, "m": 60, "h": 3600}[unit]
        period = {"s": 1, "m": 60, "h": 3600}[unit]
        for _ in range(args.rounds):
            reached = limited(
                {"rate_limit": args.rate}, jobs=int(per_second * 8), seconds=0.0, period=period
            )
            print(
                f"rate_limit={args.rate}, 4 workers: {reached:.1f} jobs/s of {per_second:.1f} "
                f"({reached / per_second:.1%})",
                flush=True,
            )

    if "serial" in parts:
        mixes = (
            (0, 50, "no keys"),
            (10, 50, "1 in 10 keyed, 50 keys"),
            (1, 50, "all keyed, 50 keys"),
            (1, 5_000, "all keyed, 5,000 keys"),
        )
        for every, keys, label in mixes:
            rates = [
                limited({}, jobs=22_000, seconds=0.0, keyed_every=every, keys=keys, workers=2)
                for _ in range(args.rounds)
            ]
            print(
                f"serial keys, 22,000 no-op jobs, 2 workers x 20, {label}: "
                f"{statistics.median(rates):,.0f} jobs/s (rounds: "
                f"{', '.join(f'{rate:,.0f}' for rate in rates)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
