"""The ``jobkeeper verify`` run: worker processes of its own on a queue of its
own, a steady mix of jobs, faults injected into the workers, a drain, the
history checker, and the clean-up of everything it wrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobkeeper.api import JobQueue
from jobkeeper.errors import DatabaseError
from jobkeeper.maintenance.leader import MAINTENANCE
from jobkeeper.verify.fleet import FAULTS, Fleet
from jobkeeper.verify.history import History, Report, Row, check, read_exec_logs
from jobkeeper.worker.schema import require_migrated

#: Worker log text that fails the run wherever it appears.
FORBIDDEN_LOG_TEXT = ("Traceback", "unexpected error")
_UNFINISHED = ("scheduled", "available", "claimed", "running", "retryable")


class BadInput(Exception):  # noqa: N818 - reads as what it is
    """The database cannot be verified as given (unreachable, not migrated)."""


@dataclasses.dataclass
class VerifyConfig:
    """What one run does.

    Attributes:
        url: the database URL.
        seconds: the fault phase, seconds.
        workers: worker processes.
        concurrency: jobs at once per worker.
        rate: jobs enqueued per second during the fault phase.
        heartbeat_interval, rescue_after: the workers' settings, seconds.
        fault_every: seconds between faults.
        drain_timeout: seconds to wait for the jobs to finish after the faults.
    """

    url: str
    seconds: float = 60.0
    workers: int = 3
    concurrency: int = 4
    rate: float = 20.0
    heartbeat_interval: float = 0.5
    rescue_after: float = 3.0
    fault_every: float = 3.0
    drain_timeout: float = 120.0


@dataclasses.dataclass
class Verdict:
    """A run's outcome: the checker's report, the faults, and the run's own
    failures (a queue that never drained, workers that exited on their own).
    """

    run: str
    backend: str
    config: VerifyConfig
    report: Report
    faults: dict[str, int]
    worker_starts: int
    failures: list[str]
    elapsed: float

    @property
    def passed(self) -> bool:
        return self.report.ok and not self.failures


def preflight(url: str) -> str:
    """The backend's name, once the database is reachable and migrated.

    Raises:
        BadInput: unreachable, or a schema that is missing or older than the code.
    """
    try:
        jq = JobQueue(url)
    except DatabaseError as exc:
        raise BadInput(str(exc)) from None
    try:
        require_migrated(jq.backend, where=jq.url.redacted())
        return "postgresql" if jq.url.scheme.startswith("postgres") else "sqlite"
    except DatabaseError as exc:
        raise BadInput(str(exc)) from None
    finally:
        jq.close()


class _Feeder:
    """Enqueues the job mix at a steady rate; records each job's kind."""

    def __init__(self, jq: JobQueue, task: str, queue: str, rng: random.Random) -> None:
        self.jq, self.task, self.queue, self.rng = jq, task, queue, rng
        self.enqueued: dict[int, str] = {}
        self.errors: list[str] = []
        self._n = 0

    def one(self) -> tuple[dict[str, Any], dict[str, Any], str]:
        r = self.rng.random
        self._n += 1
        ms = r() * 20 if r() < 0.8 else 20 + r() * 480
        if r() < 0.01:
            ms = 1000 + r() * 1500
        args: dict[str, Any] = {"n": self._n, "ms": round(ms, 3)}
        options: dict[str, Any] = {"queue": self.queue}
        mode = r()
        kind = "ok"
        if mode < 0.10:
            kind, args["mode"], args["fails"] = "flaky", "flaky", self.rng.randint(1, 2)
        elif mode < 0.15:
            kind, args["mode"], args["fails"] = "retry", "retry", self.rng.randint(1, 2)
        elif mode < 0.19:
            kind, args["mode"], options["max_attempts"] = "fail", "fail", 2
        elif mode < 0.21:
            kind, args["mode"] = "discard", "discard"
        return args, options, kind

    def batch(self, count: int) -> None:
        jobs = [self.one() for _ in range(count)]
        try:
            made = self.jq.enqueue_many([(self.task, a, o) for a, o, _ in jobs])
        except DatabaseError as exc:
            self.errors.append(f"enqueue failed: {exc}")
            return
        for job, (_, _, kind) in zip(made, jobs, strict=True):
            self.enqueued[job.id] = kind

    def cancelled(self, count: int) -> None:
        """Jobs scheduled far ahead, then cancelled before they run."""
        for _ in range(count):
            self._n += 1
            job = self.jq.enqueue(
                self.task, {"n": self._n, "ms": 1}, queue=self.queue, delay=86_400
            )
            self.enqueued[job.id] = "cancel"
            self.jq.cancel(job.id)

    def run(self, total: int, seconds: float, stop: threading.Event) -> None:
        started = time.monotonic()
        done = 0
        while done < total and not stop.is_set():
            due = min(total, int(total * (time.monotonic() - started) / seconds) + 1)
            if due > done:
                size = min(due - done, self.rng.choice((1, 5, 20)))
                self.batch(size)
                done += size
            stop.wait(0.05)


def stop_feeding(
    feeder: threading.Thread,
    stop: threading.Event,
    tick: Callable[[], None],
    timeout: float = 60.0,
) -> None:
    """Stop the feeder thread and wait for it, ticking the fleet meanwhile.

    The fault phase can end with a worker still SIGSTOPped; on SQLite one
    stopped inside a write holds the lock the feeder's last enqueue waits
    for, and only a tick sends its SIGCONT. Waits up to ``timeout`` seconds.
    """
    stop.set()
    _wait(lambda: not feeder.is_alive(), timeout, tick)


def _wait(predicate: Callable[[], bool], timeout: float, tick: Callable[[], None]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tick()
        with contextlib.suppress(DatabaseError):
            if predicate():
                return True
        time.sleep(0.25)
    return False


def read_rows(jq: JobQueue, queue: str) -> list[Row]:
    """Every row of ``queue``: its jobs and (``status="dead"``) its dead letters."""
    rows: list[Row] = []
    before: int | None = None
    while True:
        page = jq.list_jobs(queue=queue, limit=10_000, before=before)
        rows += [Row(j.id, j.status.value, j.attempt, j.result, list(j.errors)) for j in page]
        if len(page) < 10_000:
            return rows
        before = min(j.id for j in page)


def clean_up(jq: JobQueue, queue: str) -> int:
    """Delete the run's jobs, dead letters, settings, periodic rows and worker
    rows (with the maintenance lease, if a killed worker of the run held it).
    Returns the jobs and dead letters deleted.
    """
    for worker in jq.workers():
        if worker.queues == [queue]:
            jq.backend.leader_resign(name=MAINTENANCE, worker_id=worker.id)
            jq.backend.worker_deregister(worker_id=worker.id)
    return jq.backend.queue_remove(queue=queue)


def _scan_logs(paths: list[Path]) -> list[str]:
    problems = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if any(text in line for text in FORBIDDEN_LOG_TEXT):
                problems.append(f"{path.name}: {line.strip()[:200]}")
    return problems


def run_verify(
    config: VerifyConfig,
    *,
    say: Callable[[str], None] = lambda _: None,
    tamper: Callable[[History], None] | None = None,
) -> Verdict:
    """Run the check against ``config.url`` (call :func:`preflight` first).

    Args:
        config: what to run.
        say: progress lines.
        tamper: edits the history before it is checked (the tests' way to
            feed the checker a broken history end to end).

    Raises:
        DatabaseError: the database failed outside the fault phase.
    """
    began = time.monotonic()
    rng = random.Random()
    run = f"jkverify_{secrets.token_hex(4)}"
    backend = "postgresql" if config.url.startswith("postgres") else "sqlite"
    out = Path(tempfile.mkdtemp(prefix=f"{run}-"))
    log_dir = out / "exec"
    log_dir.mkdir()
    env = {
        "JKVERIFY_RUN": run,
        "JKVERIFY_LOG_DIR": str(log_dir),
        "JKVERIFY_HEARTBEAT_INTERVAL": str(config.heartbeat_interval),
        "JKVERIFY_RESCUE_AFTER": str(config.rescue_after),
        "JOBKEEPER_DATABASE_URL": config.url,
    }
    stop_for = 2 * config.rescue_after
    fleet = Fleet(config.url, run, config.workers, config.concurrency, env, out, stop_for)
    jq = JobQueue(config.url)
    failures: list[str] = []
    stop = threading.Event()
    try:
        say(f"run {run}: {config.workers} workers x {config.concurrency} on queue {run}")
        fleet.start_all()
        feeder = _Feeder(jq, f"{run}.work", run, rng)
        feeder.cancelled(5)
        total = max(int(config.rate * config.seconds), 1)
        thread = threading.Thread(
            target=feeder.run, args=(total, config.seconds, stop), daemon=True
        )
        thread.start()
        deadline = time.monotonic() + config.seconds
        next_fault = time.monotonic() + min(config.fault_every, 1.0)
        # At least one of each fault, however short the run.
        while time.monotonic() < deadline or (
            fleet.faults.total() < len(FAULTS) and time.monotonic() < deadline + 60
        ):
            fleet.tick()
            if time.monotonic() >= next_fault and not fleet.paused():
                kind = fleet.inject()
                say(f"{time.monotonic() - began:6.1f}s fault: {kind}")
                next_fault = time.monotonic() + config.fault_every * rng.uniform(0.5, 1.5)
            time.sleep(0.1)
        stop_feeding(thread, stop, fleet.tick)
        say(f"{time.monotonic() - began:6.1f}s faults over; draining")

        def drained() -> bool:
            counts = jq.stats().get(run, {})
            return sum(counts.get(s, 0) for s in _UNFINISHED) == 0

        if not _wait(drained, config.drain_timeout, fleet.tick):
            failures.append(f"the jobs did not finish within {config.drain_timeout:g}s")

        # A worker SIGTERMed before its signal handlers are installed (one
        # just restarted, still importing) dies of the signal: wait for every
        # worker to register first, so that an unclean exit means something.
        def registered() -> bool:
            ids = {w.pid for w in jq.workers() if w.queues == [run]}
            return fleet.pids() <= ids

        _wait(registered, 60, fleet.tick)
        codes = fleet.stop_all()
        if any(code != 0 for code in codes.values()):
            failures.append(
                f"workers did not stop cleanly: exit codes {sorted(codes.values(), key=str)}"
            )
        events, bad = read_exec_logs(log_dir)
        history = History(
            rescue_after=config.rescue_after,
            heartbeat_interval=config.heartbeat_interval,
            enqueued=feeder.enqueued,
            rows=read_rows(jq, run),
            events=events,
            lives=fleet.lives,
            bad_log_lines=bad,
        )
        if tamper is not None:
            tamper(history)
        report = check(history)
        failures += feeder.errors[:5]
        failures += fleet.unexpected[:5]
        failures += [f"worker log: {p}" for p in _scan_logs(fleet.logs())[:5]]
        return Verdict(
            run=run,
            backend=backend,
            config=config,
            report=report,
            faults=dict(fleet.faults),
            worker_starts=len(fleet.lives),
            failures=failures,
            elapsed=time.monotonic() - began,
        )
    finally:
        # Also on Ctrl-C and on errors: no worker, row or file is left behind.
        stop.set()
        with contextlib.suppress(Exception):
            fleet.stop_all(timeout=10)
        try:
            clean_up(jq, run)
        finally:
            jq.close()
            shutil.rmtree(out, ignore_errors=True)
