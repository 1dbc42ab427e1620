"""SQLite enqueue->start latency split into stages (a diagnostic, not a figure
of the suite).

The setting of the ``latency`` measurement: one idle worker process, jobs
enqueued one call at a time from this process, ``--gap`` seconds apart. Both
processes wrap a few jobkeeper internals to stamp ``time.time()`` as a job
passes them (a few microseconds each, so the total is a little above the
suite's), and the stamps are paired per job:

    .venv/bin/python -m benchmarks.stages [--jobs 200] [--gap 0.02] [--src DIR]

``--src`` runs another checkout's ``src`` (both processes), to compare two
revisions stage by stage. The wrapped names are internal and may move: this
script follows them, nothing depends on it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: (time.time(), what, thread name) of this process.
MARKS: list[tuple[float, str, str]] = []


def mark(what: str) -> None:
    MARKS.append((time.time(), what, threading.current_thread().name))


def _wrap(owner: Any, name: str, before: str | None, after: str | None) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before:
            mark(before)
        result = original(*args, **kwargs)
        if after and result:
            mark(after)
        return result

    setattr(owner, name, wrapped)


def install() -> None:
    """Stamp the stages: the write transaction's BEGIN and COMMIT, the wake-up
    (sent, heard, passed on), the claim, the hand-off and the task call.
    """
    from jobkeeper.backends.sqlite import connection, wakeups
    from jobkeeper.backends.sqlite.backend import SqliteBackend
    from jobkeeper.worker import producer, slots

    def write(self: Any, *, create: bool = False) -> Any:
        @contextlib.contextmanager
        def transaction() -> Iterator[Any]:
            with self._errors():
                conn = self._conn(create=create)
                mark("begin")
                self._begin_immediate(conn)
                mark("begun")
                try:
                    yield conn
                    mark("commit")
                    conn.execute("COMMIT")
                    mark("committed")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise

        return transaction()

    connection.SqliteConnection._write = write  # type: ignore[method-assign]
    _wrap(SqliteBackend, "job_insert_many", "insert", None)
    _wrap(SqliteBackend, "wake_listeners", "wake_send", None)
    _wrap(SqliteBackend, "job_claim", "claim", "claimed")
    _wrap(wakeups._Doorbell, "wait", None, "heard")
    _wrap(producer.Producer, "on_queue", "on_queue", None)
    _wrap(slots.Slots, "offer", "offer", None)
    _wrap(slots.Slots, "_start_next", None, "runner")


# -- the worker process ----------------------------------------------------------

if __name__ == "__main__" and "--src" in sys.argv:
    # Before jobkeeper is imported: this process enqueues with that checkout.
    sys.path.insert(0, os.path.abspath(sys.argv[sys.argv.index("--src") + 1]))

from jobkeeper import JobQueue, JobStatus  # noqa: E402

jq = JobQueue("sqlite:///unused-stages.db")


@jq.task
def stamp(i: int) -> None:
    """Marks its call."""
    mark(f"task {i}")


def _dump(path: str) -> None:
    with open(path, "w") as out:
        json.dump(MARKS, out)


def worker_main(url: str, out: str) -> None:
    # The worker imports the app as benchmarks.stages, a module apart from
    # __main__: its task marks there, so the stamps are kept there too.
    from benchmarks import stages
    from jobkeeper.cli.main import main

    stages.install()
    # Written as the worker exits (SIGTERM is its graceful stop).
    atexit.register(stages._dump, out)
    main(["--database", url, "worker", "--app", "benchmarks.stages:jq", "--concurrency", "10"])


# -- pairing the stamps ----------------------------------------------------------

STAGES: list[tuple[str, str, str]] = [
    ("enqueue: call -> insert (validation)", "call", "insert"),
    ("enqueue: BEGIN IMMEDIATE", "insert", "e_begun"),
    ("enqueue: statements", "e_begun", "e_commit"),
    ("enqueue: COMMIT (fsync)", "e_commit", "e_committed"),
    ("wake: commit -> datagram sent", "e_committed", "wake_send"),
    ("wake: sent -> listener woken", "wake_send", "heard"),
    ("wake: listener -> producer told", "heard", "on_queue"),
    ("producer: told -> claim call", "on_queue", "claim"),
    ("claim: probe + BEGIN IMMEDIATE", "claim", "c_begun"),
    ("claim: statements", "c_begun", "c_commit"),
    ("claim: COMMIT (fsync)", "c_commit", "c_committed"),
    ("claim: commit -> jobs returned", "c_committed", "claimed"),
    ("hand-off: offer -> runner", "offer", "runner"),
    ("runner: -> task called", "runner", "task"),
    ("TOTAL: enqueue call -> task", "call", "task"),
]


def _pair(enqueuer: list[Any], worker: list[Any]) -> dict[int, dict[str, float]]:
    jobs: dict[int, dict[str, float]] = {}
    current: dict[str, float] | None = None
    for t, what, _ in enqueuer:
        if what.startswith("call "):
            current = jobs.setdefault(int(what.split()[1]), {"call": t})
        elif current is not None:
            key = {"begun": "e_begun", "commit": "e_commit", "committed": "e_committed"}.get(
                what, what
            )
            current.setdefault(key, t)
    tasks = {int(w.split()[1]): t for t, w, _ in worker if w.startswith("task ")}
    ordered = sorted(worker)
    for i, job in jobs.items():
        if i not in tasks or "wake_send" not in job:
            continue
        job["task"] = tasks[i]
        window = [(t, w, th) for t, w, th in ordered if job["wake_send"] <= t <= job["task"]]
        claim_start: float | None = None
        for t, what, thread in window:
            if what == "heard" and thread == "jobkeeper-listener":
                job.setdefault("heard", t)
            elif what == "on_queue":
                job.setdefault("on_queue", t)
            elif thread != "MainThread":
                if what == "runner":
                    job.setdefault("runner", t)
            elif what == "claim" and "on_queue" in job and "claimed" not in job:
                claim_start = t
                job["claim"] = t
                for stale in ("c_begun", "c_commit", "c_committed"):
                    job.pop(stale, None)
            elif claim_start is not None and what in ("begun", "commit", "committed"):
                job.setdefault("c_" + what, t)
            elif what == "claimed" and claim_start is not None and "c_committed" in job:
                job.setdefault("claimed", t)
            elif what == "offer" and "claimed" in job:
                job.setdefault("offer", t)
    return jobs


def report(jobs: dict[int, dict[str, float]]) -> None:
    print(f"{'stage (ms)':40s} {'n':>4s} {'p50':>7s} {'p90':>7s} {'p99':>7s}")
    for label, start, end in STAGES:
        values = sorted(
            (j[end] - j[start]) * 1000 for j in jobs.values() if start in j and end in j
        )
        if not values:
            print(f"{label:40s} n/a")
            continue

        def at(p: float, v: list[float] = values) -> float:
            return v[min(len(v) - 1, int(p / 100 * len(v)))]

        print(f"{label:40s} {len(values):4d} {at(50):7.3f} {at(90):7.3f} {at(99):7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.020)
    parser.add_argument("--src", help="a checkout's src directory to run instead")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(*args.worker)
        return
    install()
    src = os.path.abspath(args.src) if args.src else None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, str(ROOT)]))}
    with tempfile.TemporaryDirectory() as tmp:
        url, out = f"sqlite:///{tmp}/stages.db", f"{tmp}/worker.json"
        queue = jq.using(url)
        queue.migrate()
        argv = [sys.executable, "-m", "benchmarks.stages", "--worker", url, out]
        with open(f"{tmp}/worker.log", "w") as log:
            worker = subprocess.Popen(argv, env=env, cwd=ROOT, stderr=log)
            try:
                _run(queue, args.jobs, args.gap)
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
        report(_pair(MARKS, json.loads(Path(out).read_text())))


def _wait_done(queue: Any, job_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = queue.get_job(job_id)
        if job is not None and job.status == JobStatus.COMPLETED:
            return
        time.sleep(0.05)
    raise SystemExit(f"job {job_id} did not complete within {timeout:.0f} s")


def _run(queue: Any, jobs: int, gap: float) -> None:
    _wait_done(queue, queue.enqueue("stamp", {"i": -1}).id, 60)
    time.sleep(1.5)  # let the worker go idle
    MARKS.clear()
    base = time.perf_counter()
    last = 0
    for i in range(jobs):
        pause = base + i * gap - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        mark(f"call {i}")
        last = queue.enqueue("stamp", {"i": i}).id
    _wait_done(queue, last, 30)


if __name__ == "__main__":
    main()
