"""Many worker processes on one PostgreSQL (issue 18, item 4).

1, 2 and 4 jobkeeper worker processes (the CLI, ``--burst``) drain one backlog
of no-op jobs, each with ``--concurrency`` 10 and then 50; beside them, in the
same run, the raw batched claim+complete drain (``benchmarks/raw.py``, batch
100) with 1, 2 and 4 clients. For each: jobs/s, the PostgreSQL server's CPU
per job (the whole machine's busy CPU less the clients': see
:class:`MachineCpu`) and the clients' own CPU per job. Both sides are timed
once working, as the raw clients always were (after they connected): the
workers from the first jobs done once every one of them has started, their
start-up (imports, connections: about 0.3 s of CPU a process) left out of
the rate and the CPU; the rate from the spawn is shown beside it.

    .venv/bin/python -m benchmarks.processes [--jobs 40000] [--rounds 3]

Rounds are interleaved (every configuration once, then again); the table
shows medians. Figures are printed, never asserted. The URL comes from
``$JOBKEEPER_BENCH_PG_URL`` (default: the test server); every measurement
runs in a database of its own, created for it and dropped after.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg

from benchmarks import raw
from benchmarks.harness import DEFAULT_PG_URL, PG_URL_ENV, PgServer, log
from benchmarks.libs import Jobkeeper

ROOT = Path(__file__).resolve().parents[1]
FILL = """
import sys
from benchmarks.apps.jobkeeper_app import jq
jq = jq.using(sys.argv[1])
jq.migrate()
n = int(sys.argv[2])
for start in range(0, n, 1000):
    jq.enqueue_many([("noop", {})] * min(1000, n - start))
"""


class MachineCpu:
    """CPU seconds the whole machine spent (busy, all cores) between
    :meth:`start` and :meth:`stop`. Less the clients' own CPU, that is the
    server's share: a backend lives only as long as its connection, too short
    to be sampled reliably, so the server is measured as the rest of the
    machine (run it quiet: anything else running counts too).
    """

    def start(self) -> None:
        self._began = self._busy()
        self._own = self._self_cpu()

    @staticmethod
    def _busy() -> float:
        times = psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    @staticmethod
    def _self_cpu() -> float:
        """This process and its reaped children (the clients)."""
        return sum(
            usage.ru_utime + usage.ru_stime
            for usage in (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),
            )
        )

    def stop(self) -> tuple[float, float]:
        """``(machine busy seconds, this process's CPU seconds)`` since start."""
        return self._busy() - self._began, self._self_cpu() - self._own


def remaining(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobkeeper_jobs WHERE status <> 'completed'"
        ).fetchone()
    return int(row[0]) if row else 0


class StartedLog:
    """Reads a worker's stderr on a thread of its own (a pipe left unread
    would block a worker that logs more than it holds) and sets ``started``
    at the worker's "worker ... started on ..." line.
    """

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.started = threading.Event()
        self._lines: collections.deque[str] = collections.deque(maxlen=5)
        assert proc.stderr is not None
        self._stderr = proc.stderr
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stderr:
            self._lines.append(line.rstrip())
            if " started on " in line:
                self.started.set()

    def tail(self) -> str:
        return " | ".join(self._lines) or "(no output)"


def _cpu_of(pid: int) -> float:
    """A live process's own CPU seconds so far (0 once it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def jobkeeper_drain(url: str, jobs: int, processes: int, concurrency: int) -> dict[str, float]:
    """Fill ``jobs`` no-op jobs, then drain them with ``processes`` CLI workers.

    Timed as the raw clients are, once working (they start together behind a
    barrier, after connecting): from the first poll that sees jobs done once
    every worker has logged that it started (its imports and connections
    done) to the last poll; the rate counts the jobs done in that window, and
    the CPU figures are the window's. Timed from the first jobs done instead,
    on 2 cores, the 4-process figure held up to three workers' start-up
    (about 0.3 s of CPU each) inside its window. ``jobs_per_s_spawned`` is
    the rate from the spawn, start-ups included.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", FILL, url, str(jobs)], check=True, env=env)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobkeeper_jobs")
    # The drain benchmark's worker command, at this concurrency, draining once.
    argv, _ = Jobkeeper().worker_command(url)
    argv[argv.index("--concurrency") + 1] = str(concurrency)
    argv.append("--burst")
    machine = MachineCpu()
    began = time.perf_counter()
    procs = [
        subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    logs = [StartedLog(proc) for proc in procs]
    first_at: float | None = None
    left_at_first = jobs
    workers_at_first = 0.0
    done_at: float | None = None
    while done_at is None:
        time.sleep(0.01 if first_at is None else 0.02)
        left = remaining(url)
        if first_at is None and left < jobs and all(log.started.is_set() for log in logs):
            first_at, left_at_first = time.perf_counter(), left
            machine.start()
            workers_at_first = sum(_cpu_of(proc.pid) for proc in procs)
        if left == 0:
            done_at = time.perf_counter()
        elif all(p.poll() is not None for p in procs):
            raise RuntimeError(
                f"workers exited with {left} jobs left: {' / '.join(log.tail() for log in logs)}"
            )
    assert first_at is not None
    worker_cpu = 0.0
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        worker_cpu += usage.ru_utime + usage.ru_stime
    busy, own = machine.stop()  # own: ours, and the reaped workers' whole CPU
    in_window = worker_cpu - workers_at_first
    server = busy - (own - worker_cpu) - in_window
    return {
        "jobs_per_s": left_at_first / (done_at - first_at),
        "jobs_per_s_spawned": jobs / (done_at - began),
        "server_us": server * 1e6 / left_at_first,
        "worker_us": in_window * 1e6 / left_at_first,
    }


def raw_drain(url: str, jobs: int, clients: int) -> dict[str, float]:
    raw.pg_prepare(url)
    raw.pg_fill(url, jobs)
    machine = MachineCpu()
    machine.start()
    run = raw.pg_clients(url, "drain", 100, clients, jobs)
    busy, own = machine.stop()  # own: the reaped clients' whole CPU, and ours
    if run.done != jobs:
        raise RuntimeError(f"raw drain did {run.done} of {jobs} jobs")
    return {
        "jobs_per_s": run.done / run.seconds,
        "server_us": (busy - own) * 1e6 / run.done,
        "client_us": run.cpu * 1e6 / run.done,
    }


#: Worker processes and client counts measured, in the table's order.
PROCESS_COUNTS = (1, 2, 4)
CONCURRENCIES = (10, 50)


def jobkeeper_label(processes: int, concurrency: int) -> str:
    return f"jobkeeper, {processes} process{'es' if processes > 1 else ''}, c={concurrency}"


def raw_label(clients: int) -> str:
    return f"raw claim+complete, batch 100, {clients} client{'s' if clients > 1 else ''}"


def measure(server: PgServer, jobs: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """Every configuration once per round, rounds interleaved, each drain in a
    fresh database on ``server``; returns each configuration's figures by label.
    """
    configs: list[tuple[str, Callable[[str], dict[str, float]]]] = []
    for concurrency in CONCURRENCIES:
        for processes in PROCESS_COUNTS:
            configs.append(
                (
                    jobkeeper_label(processes, concurrency),
                    lambda url, p=processes, c=concurrency: jobkeeper_drain(url, jobs, p, c),
                )
            )
    for clients in PROCESS_COUNTS:
        configs.append((raw_label(clients), lambda url, c=clients: raw_drain(url, jobs, c)))
    figures: dict[str, list[dict[str, float]]] = {name: [] for name, _ in configs}
    for round_ in range(rounds):
        for name, run in configs:
            with server.fresh("procs") as url:
                figures[name].append(run(url))
            log(f"processes, round {round_ + 1}: {name}: {figures[name][-1]}")
    return figures


def medians(figures: dict[str, list[dict[str, float]]], key: str) -> dict[str, float]:
    """Each configuration's median of ``key`` (configurations without it left out)."""
    out: dict[str, float] = {}
    for name, runs in figures.items():
        values = [run[key] for run in runs if key in run]
        if values:
            out[name] = statistics.median(values)
    return out


def scaling_steps(figures: dict[str, list[dict[str, float]]]) -> list[tuple[str, float, float]]:
    """For each step that adds processes (1 to 2, 2 to 4) at each concurrency:
    ``(step, jobkeeper's jobs/s ratio, the raw drain's ratio for as many clients)``.
    The raw ratio says whether the database itself still had room at that step.
    """
    rates = medians(figures, "jobs_per_s")
    steps = []
    for concurrency in CONCURRENCIES:
        for before, after in itertools.pairwise(PROCESS_COUNTS):
            jk_before = rates.get(jobkeeper_label(before, concurrency))
            jk_after = rates.get(jobkeeper_label(after, concurrency))
            raw_before, raw_after = rates.get(raw_label(before)), rates.get(raw_label(after))
            if jk_before and jk_after and raw_before and raw_after:
                steps.append(
                    (
                        f"c={concurrency}, {before}->{after}",
                        jk_after / jk_before,
                        raw_after / raw_before,
                    )
                )
    return steps


def render(figures: dict[str, list[dict[str, float]]], jobs: int, rounds: int) -> str:
    lines = [
        f"many worker processes: {jobs:,} no-op jobs per drain, medians of {rounds} interleaved "
        f"round(s), {os.cpu_count()} cores, PostgreSQL on the same machine",
        "jobs/s and CPU once working (see benchmarks/processes.py); 'from spawn' includes "
        "the workers' start-up",
        f"{'':58} {'jobs/s':>9} {'server us/job':>14} {'client us/job':>14} {'from spawn':>11}",
    ]
    # The client column: the workers' CPU for jobkeeper, the clients' for raw.
    clients = {**medians(figures, "worker_us"), **medians(figures, "client_us")}
    columns = [
        medians(figures, "jobs_per_s"),
        medians(figures, "server_us"),
        clients,
        medians(figures, "jobs_per_s_spawned"),
    ]
    for name in figures:
        cells = [f"{column[name]:,.0f}" if name in column else "-" for column in columns]
        lines.append(f"{name:58} {cells[0]:>9} {cells[1]:>14} {cells[2]:>14} {cells[3]:>11}")
    for step, jk_ratio, raw_ratio in scaling_steps(figures):
        lines.append(f"  adding processes, {step}: jobkeeper x{jk_ratio:.2f}, raw x{raw_ratio:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=40_000, help="backlog per drain")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--pg-url", default=os.environ.get(PG_URL_ENV, DEFAULT_PG_URL))
    args = parser.parse_args(argv)
    server = PgServer(args.pg_url)
    server.drop_stale()
    try:
        figures = measure(server, args.jobs, args.rounds)
    finally:
        server.drop_all()
    print(render(figures, args.jobs, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
