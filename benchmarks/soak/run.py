"""The chaos soak driver.

    python -m benchmarks.soak.run --backend postgres --minutes 20
    python -m benchmarks.soak.run --backend sqlite --minutes 2

Starts worker processes, enqueues jobs of mixed duration and failure rate
while injecting faults (worker SIGKILL + restart, SIGSTOP past rescue_after,
``pg_terminate_backend``, PostgreSQL restarts: fast, immediate, kill -9, and
with ``--partitions`` worker hosts cut off both ways and one way), lets
the queue drain, runs a no-op phase measuring worker RSS, stops the workers,
checks that an ``enqueue`` against a stopped PostgreSQL fails clearly, and
runs the history checker. Prints a summary; exit code 0 only if everything
passed. See README.md in this directory.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import math
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.soak import instrument, netns
from benchmarks.soak.faults import Faults, Life, Workers, rss_bytes
from benchmarks.soak.history import (
    Expected,
    History,
    Report,
    Row,
    check,
    deaths_by_pid,
    faulted_at,
    percentile,
    read_exec_logs,
    rescues_of,
)
from benchmarks.soak.pg import PrivatePostgres
from jobkeeper import DatabaseError, DatabaseUnavailable, JobQueue
from jobkeeper.verify.history import pid_of

QUEUES = ["default", "bulk", "noop"]
#: Worker log lines that are a failure wherever they appear.
FORBIDDEN_LOG_TEXT = ("Traceback", "prepared statement", "unexpected error")


@dataclasses.dataclass
class SoakConfig:
    """What one soak run does (the defaults are the CI-sized short run)."""

    backend: str = "postgres"
    seconds: float = 30.0  # the fault phase
    jobs: int = 2500  # chaos jobs enqueued during the fault phase
    noop_jobs: int = 6000  # the memory phase
    workers: int = 4
    concurrency: int = 8
    heartbeat_interval: float = 0.5
    rescue_after: float = 3.0
    poll_interval: float = 0.2
    max_backoff: float = 0.5
    fault_every: float = 2.0  # seconds between faults
    stop_for: float | None = None  # SIGSTOP duration (default 2 x rescue_after)
    drain_timeout: float = 120.0
    probe_pool_timeout: float | None = None  # None: jobkeeper's own POOL_TIMEOUT
    rss_bound_mib: float = 32.0
    poison_jobs: int = 2  # jobs that SIGKILL their worker at every attempt
    max_crashes: int = 2
    seed: int = 1
    keep: bool = False
    out: Path | None = None  # where to put logs (default: a temp dir)
    verbose: bool = True
    #: Flow control on: the bulk queue gets a concurrency cap and a rate
    #: limit, and a share of the default queue's jobs get serial keys; the
    #: checker then also holds the cap and the keys (see history.py).
    limits: bool = False
    cap: int = 3
    rate_per_second: int = 20
    serial_share: float = 0.3  # of the default queue's jobs
    serial_keys: int = 20
    #: Partitions on (PostgreSQL only): each worker runs in a network
    #: namespace of its own and the rotation cuts hosts off (both ways, only
    #: outgoing, only incoming) for ``stop_for`` seconds, then heals them.
    partitions: bool = False


@dataclasses.dataclass
class SoakResult:
    config: SoakConfig
    report: Report
    faults: dict[str, int]
    terminated_connections: int
    enqueue_refused: int
    enqueue_errors: list[str]
    probe: dict[str, Any]
    rss: dict[str, Any]
    exit_codes: dict[int, int | None]
    unexpected_exits: list[str]
    log_problems: list[str]
    worker_starts: int
    poison_kills: int
    rescued_holders: dict[str, Any]
    elapsed: float
    failures: list[str]
    summary: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures


def _mib(value: float) -> str:
    return f"{value / (1 << 20):+.1f} MiB"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


class _Enqueuer:
    """Enqueues the chaos mix at a steady rate, through faults."""

    def __init__(
        self,
        jq: JobQueue,
        rng: random.Random,
        faults: Faults | None,
        serial: tuple[float, int] | None = None,
    ) -> None:
        self.jq = jq
        self.rng = rng
        self.faults = faults
        #: (share of the default queue's jobs, number of keys) or None.
        self.serial = serial
        self.enqueued: dict[int, Expected] = {}
        self.ambiguous: dict[int, str] = {}
        self.refused = 0
        self.errors: list[str] = []
        self.refusal_messages: list[str] = []
        self._token = 0

    def token(self) -> int:
        self._token += 1
        return self._token

    def job(self) -> tuple[str, dict[str, Any], dict[str, Any], str]:
        r = self.rng.random
        n = self.token()
        duration = r()
        if duration < 0.6:
            ms = r() * 5
        elif duration < 0.85:
            ms = 5 + r() * 45
        elif duration < 0.98:
            ms = 50 + r() * 250
        else:
            ms = 1000 + r() * 2000
        mode = r()
        options: dict[str, Any] = {"queue": "bulk" if r() < 0.2 else "default"}
        if r() < 0.1:
            options["priority"] = self.rng.randint(-5, 5)
        if self.serial is not None and options["queue"] == "default" and r() < self.serial[0]:
            options["serial_key"] = f"user:{self.rng.randrange(self.serial[1])}"
        args: dict[str, Any] = {"n": n, "ms": round(ms, 3)}
        if mode < 0.78:
            kind = "ok"
        elif mode < 0.88:
            kind, args["mode"], args["fails"] = "flaky", "flaky", self.rng.randint(1, 2)
        elif mode < 0.93:
            kind, args["mode"], args["fails"] = "retry", "retry", self.rng.randint(1, 2)
        elif mode < 0.98:
            kind, args["mode"] = "fail", "fail"
            options["max_attempts"] = 3
        else:
            kind, args["mode"] = "discard", "discard"
        task = "soak.work"
        if r() < 0.15:
            task = "soak.work_async"
        elif r() < 0.04:
            args["cpu"] = True
            args["ms"] = min(args["ms"], 50.0)
        return task, args, options, kind

    def enqueue_batch(self, count: int) -> None:
        batch = [self.job() for _ in range(count)]
        try:
            if len(batch) == 1:
                task, args, options, _ = batch[0]
                jobs = [self.jq.enqueue(task, args, **options)]
            else:
                jobs = self.jq.enqueue_many([(t, a, o) for t, a, o, _ in batch])
        except DatabaseUnavailable as exc:
            # A commit whose reply was lost may still have happened: these
            # tokens may exist (once), or not.
            self.refused += 1
            self.refusal_messages.append(str(exc))
            for _, args, _, kind in batch:
                self.ambiguous[args["n"]] = kind
            return
        except DatabaseError as exc:
            self.errors.append(f"enqueue raised {type(exc).__name__}: {exc}")
            for _, args, _, kind in batch:
                self.ambiguous[args["n"]] = kind
            return
        for job, (_, args, _, kind) in zip(jobs, batch, strict=True):
            self.enqueued[job.id] = Expected(args["n"], kind)

    def run(self, total: int, seconds: float, stop: threading.Event) -> None:
        started = time.monotonic()
        done = 0
        while done < total and not stop.is_set():
            due = min(total, int(total * (time.monotonic() - started) / seconds) + 1)
            while done < due and not stop.is_set():
                size = min(due - done, self.rng.choice((1, 1, 5, 20, 50)))
                if self.rng.random() < 0.01:
                    # Now and then a batch past COPY_MIN_JOBS, ahead of the
                    # schedule: PostgreSQL copies it in while validating it,
                    # the path whose transaction faults must not split.
                    size = min(total - done, 100)
                self.enqueue_batch(size)
                done += size
            stop.wait(0.05)

    def poison(self, count: int) -> None:
        """Jobs that kill their worker at every attempt (the crash budget)."""
        for _ in range(count):
            n = self.token()
            job = self.jq.enqueue("soak.poison", {"n": n})
            self.enqueued[job.id] = Expected(n, "poison")

    def special(self) -> None:
        """Jobs left pending on purpose, and pending jobs cancelled."""
        for kind in ("pending", "cancel"):
            for _ in range(10):
                n = self.token()
                job = self.jq.enqueue("soak.work", {"n": n, "ms": 1}, delay=86_400)
                self.enqueued[job.id] = Expected(n, kind)
                if kind == "cancel":
                    self.jq.cancel(job.id)


class _NoWorkers(Exception):  # noqa: N818
    """No worker process is left running."""


def _pending(jq: JobQueue, queues: list[str]) -> int:
    """Jobs not yet finished (the deliberately pending ones are scheduled: not counted)."""
    stats = jq.stats()
    return sum(
        stats.get(q, {}).get(s, 0)
        for q in queues
        for s in ("available", "claimed", "running", "retryable")
    )


def _wait(predicate: Any, timeout: float, poll: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(DatabaseError):
            if predicate():
                return True
        time.sleep(poll)
    return False


def _scan_logs(paths: list[Path]) -> tuple[list[str], Counter[str]]:
    problems: list[str] = []
    notes: Counter[str] = Counter()
    for path in paths:
        text = path.read_text(errors="replace")
        for line in text.splitlines():
            for forbidden in FORBIDDEN_LOG_TEXT:
                if forbidden in line:
                    problems.append(f"{path.name}: {line.strip()[:300]}")
            if "database unavailable" in line or "unavailable" in line:
                notes["unavailable warnings"] += 1
            if "claim lost before its outcome was written" in line:
                notes["fenced acks (claim lost)"] += 1
            if "rescued" in line and "jobs of lost workers" in line:
                notes["rescue log lines"] += 1
            if "handed back" in line and "claim reply was lost" in line:
                notes["claim replies lost, handed back"] += 1
    return problems[:50], notes


def run_soak(config: SoakConfig) -> SoakResult:
    rng = random.Random(config.seed)
    began = time.monotonic()
    out = Path(config.out or tempfile.mkdtemp(prefix="jobkeeper-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    log_dir = out / "exec"
    log_dir.mkdir(exist_ok=True)
    say = functools.partial(print, flush=True) if config.verbose else (lambda *a, **k: None)
    stop_for = config.stop_for if config.stop_for is not None else 2 * config.rescue_after
    pg: PrivatePostgres | None = None
    workers: Workers | None = None
    hosts: netns.Hosts | None = None
    failures: list[str] = []
    # The driver's own pool and API logs (reconnect noise) go to a file.
    handler = logging.FileHandler(out / "driver.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved_loggers = {}
    for name in ("psycopg", "jobkeeper"):
        logger = logging.getLogger(name)
        saved_loggers[name] = logger.propagate
        logger.addHandler(handler)
        logger.propagate = False
    try:
        if config.partitions and config.backend != "postgres":
            raise SystemExit("partitions need PostgreSQL (SQLite has no network)")
        if config.backend == "postgres":
            if config.partitions:
                why_not = netns.available()
                if why_not is not None:
                    raise SystemExit(f"partitions: network namespaces unavailable: {why_not}")
                hosts = netns.Hosts(config.workers)
                pg = PrivatePostgres(listen=hosts.gateways, trusted=hosts.subnets)
            else:
                pg = PrivatePostgres()
            pg.init()
            url = pg.url
        elif config.backend == "sqlite":
            url = f"sqlite:///{out / 'soak.db'}"
        else:
            raise SystemExit(f"unknown backend {config.backend!r}")
        settings = {
            "heartbeat_interval": config.heartbeat_interval,
            "rescue_after": config.rescue_after,
            "poll_interval": config.poll_interval,
            "max_backoff": config.max_backoff,
            "shutdown_grace": 5.0,
            "max_crashes": config.max_crashes,
        }
        jq = JobQueue(url, **settings)
        jq.migrate()
        caps: dict[str, int] = {}
        rate_limits: dict[str, tuple[int, float]] = {}
        if config.limits:
            jq.configure_queue(
                "bulk", concurrency=config.cap, rate_limit=f"{config.rate_per_second}/s"
            )
            caps["bulk"] = config.cap
            rate_limits["bulk"] = (config.rate_per_second, 1.0)
        instrument.install(url)
        env = {f"SOAK_{k.upper()}": str(v) for k, v in settings.items()}
        env["SOAK_LOG_DIR"] = str(log_dir)
        workers = Workers(url, config.workers, config.concurrency, QUEUES, env, out, hosts=hosts)
        say(f"soak: {config.backend} at {url}; logs in {out}")
        workers.start_all()
        faults = Faults(
            workers,
            pg,
            rng,
            stop_for=stop_for,
            long_outage=1.5 * config.rescue_after,
            partitions=config.partitions,
        )
        serial = (config.serial_share, config.serial_keys) if config.limits else None
        enqueuer = _Enqueuer(jq, rng, faults, serial)
        enqueuer.special()
        workers.self_kills_expected = config.poison_jobs > 0
        enqueuer.poison(config.poison_jobs)

        # -- the fault phase ------------------------------------------------------
        stop = threading.Event()
        feeder = threading.Thread(
            target=enqueuer.run, args=(config.jobs, config.seconds, stop), daemon=True
        )
        feeder.start()
        deadline = time.monotonic() + config.seconds
        next_fault = time.monotonic() + min(config.fault_every, 2.0)
        while time.monotonic() < deadline:
            workers.check()
            if time.monotonic() >= next_fault:
                kind = faults.inject_next()
                say(f"  {time.monotonic() - began:6.1f}s fault: {kind}")
                next_fault = time.monotonic() + config.fault_every * rng.uniform(0.5, 1.5)
            time.sleep(0.1)
        feeder.join(timeout=config.seconds + 60)
        stop.set()
        say(f"  {time.monotonic() - began:6.1f}s faults over; draining")

        def drained() -> bool:
            workers.check()
            if not workers.alive():
                raise _NoWorkers
            return _pending(jq, QUEUES) == 0

        try:
            if not _wait(drained, config.drain_timeout):
                failures.append(f"queue did not drain within {config.drain_timeout:g}s")
        except _NoWorkers:
            failures.append("every worker exited on its own (a crash loop); queue not drained")

        # -- the memory phase -----------------------------------------------------
        rss: dict[str, Any] = {"jobs": config.noop_jobs}
        if config.noop_jobs and workers.alive():
            pids = workers.pids()
            noop_started = time.monotonic()
            for start in range(0, config.noop_jobs, 1000):
                batch = []
                for _ in range(min(1000, config.noop_jobs - start)):
                    n = enqueuer.token()
                    batch.append(("soak.noop", {"n": n}, {"queue": "noop"}))
                jobs = jq.enqueue_many(batch)
                for job, (_, args, _) in zip(jobs, batch, strict=True):
                    enqueuer.enqueued[job.id] = Expected(args["n"], "noop")
            warm_target = config.noop_jobs * 0.8  # still to run at the warm-up sample
            _wait(lambda: _pending(jq, ["noop"]) <= warm_target, config.drain_timeout, 0.05)
            warm = {pid: rss_bytes(pid) for pid in pids.values()}
            peak = dict(warm)
            end_ok = False
            deadline = time.monotonic() + config.drain_timeout
            while time.monotonic() < deadline:
                for pid in pids.values():
                    value = rss_bytes(pid)
                    if value is not None and (peak.get(pid) or 0) < value:
                        peak[pid] = value
                with contextlib.suppress(DatabaseError):
                    if _pending(jq, ["noop"]) == 0:
                        end_ok = True
                        break
                time.sleep(0.2)
            if not end_ok:
                failures.append("no-op phase did not finish")
            end = {pid: rss_bytes(pid) for pid in pids.values()}
            growth = {
                pid: (end[pid] or 0) - (warm[pid] or 0)
                for pid in pids.values()
                if warm.get(pid) and end.get(pid)
            }
            rss.update(
                seconds=time.monotonic() - noop_started,
                warm_mib={p: (v or 0) / (1 << 20) for p, v in warm.items()},
                end_mib={p: (v or 0) / (1 << 20) for p, v in end.items()},
                peak_mib={p: (v or 0) / (1 << 20) for p, v in peak.items()},
                max_growth=max(growth.values(), default=0),
            )
            if rss["max_growth"] > config.rss_bound_mib * (1 << 20):
                failures.append(
                    f"worker RSS grew {_mib(rss['max_growth'])} over the no-op phase "
                    f"(bound {config.rss_bound_mib:g} MiB)"
                )

        # -- stop -----------------------------------------------------------------
        workers.check()

        # A worker SIGTERMed before its signal handlers are installed (one a
        # poison job killed near the end, restarted and still importing) dies
        # of the signal: wait until every live worker has registered, so that
        # an unclean exit means something (as jobkeeper verify does).
        def registered() -> bool:
            with contextlib.suppress(DatabaseError):
                return set(workers.pids().values()) <= {w.pid for w in jq.workers()}
            return False

        _wait(registered, 60)
        exit_codes = workers.stop_all(timeout=30)
        if any(code != 0 for code in exit_codes.values()):
            failures.append(f"workers did not stop cleanly: exit codes {exit_codes}")

        # -- enqueue against a stopped database -----------------------------------
        probe: dict[str, Any] = {}
        if pg is not None:
            probe = _probe_down(pg, config, settings)
            if not probe.get("ok"):
                failures.append(f"enqueue while PostgreSQL was down: {probe.get('detail')}")

        # -- check ----------------------------------------------------------------
        rows, heartbeats, acks = instrument.read_state(url)
        if probe.get("token") is not None and any(row.token == probe["token"] for row in rows):
            failures.append("the enqueue refused while the database was down was written")
        rows = [row for row in rows if row.token != probe.get("token")]
        events, bad_lines = read_exec_logs(log_dir)
        first_seen: dict[str, float] = {}
        for event in events:
            first_seen[event.worker] = min(first_seen.get(event.worker, event.t), event.t)
        for worker, beats in heartbeats.items():
            if beats:
                first_seen[worker] = min(first_seen.get(worker, beats[0]), min(beats))
        lives = [(life.pid, life.started, life.died) for life in workers.lives]
        faulted = fault_windows(workers.lives, faults.pauses, faults.cuts)
        history = History(
            rescue_after=config.rescue_after,
            faulted=faulted,
            enqueued=enqueuer.enqueued,
            ambiguous=enqueuer.ambiguous,
            rows=rows,
            events=events,
            heartbeats=heartbeats,
            acks=acks,
            deaths=deaths_by_pid(first_seen, lives),
            bad_log_lines=bad_lines,
            caps=caps,
            rate_limits=rate_limits,
        )
        report = check(history)
        holders = classify_rescues(rows, workers.lives, faults.pauses, faults.cuts)
        if holders["live"]:
            failures.append(
                f"{holders['live']} rescues took jobs from live, running workers: "
                + "; ".join(holders["examples"])
            )
        if not report.ok:
            failures.append(f"history checker: {len(report.violations)} violations")
        if workers.unexpected:
            failures.append(f"{len(workers.unexpected)} workers exited on their own")
        poison_failures, poison_notes = _check_poison(jq, enqueuer, workers, config, rows, faulted)
        failures.extend(poison_failures)
        log_problems, notes = _scan_logs(workers.logs())
        for text in poison_notes:
            notes[text] += 1
        if log_problems:
            failures.append(f"{len(log_problems)} forbidden lines in worker logs")
        if enqueuer.errors:
            failures.append(f"{len(enqueuer.errors)} enqueue calls failed with an unclear error")
        expected_kinds = set(faults.rotation)
        missing = expected_kinds - set(faults.counts)
        if missing:
            failures.append(f"faults never injected (run longer): {sorted(missing)}")
        result = SoakResult(
            config=config,
            report=report,
            faults=dict(faults.counts),
            terminated_connections=faults.terminated_connections,
            enqueue_refused=enqueuer.refused,
            enqueue_errors=enqueuer.errors,
            probe=probe,
            rss=rss,
            exit_codes=exit_codes,
            unexpected_exits=workers.unexpected,
            log_problems=log_problems,
            worker_starts=len(workers.lives),
            poison_kills=workers.self_kills,
            rescued_holders=holders,
            elapsed=time.monotonic() - began,
            failures=failures,
        )
        result.summary = summarize(result, notes, enqueuer.refusal_messages, out)
        return result
    finally:
        for name, propagate in saved_loggers.items():
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).propagate = propagate
        handler.close()
        if workers is not None:
            with contextlib.suppress(Exception):
                workers.stop_all(timeout=10)
        if pg is not None:
            pg.cleanup()
        if hosts is not None:
            hosts.destroy()
        if not config.keep and config.out is None:
            shutil.rmtree(out, ignore_errors=True)


def _check_poison(
    jq: JobQueue,
    enqueuer: _Enqueuer,
    workers: Workers,
    config: SoakConfig,
    rows: list[Row],
    faulted: Mapping[int, Sequence[tuple[float, float]]],
) -> tuple[list[str], list[str]]:
    """The crash budget held: each poison job is dead for its crashes after at
    most ``max_crashes + 1`` lost attempts of its own (the first may have run
    beside others) plus those the injected faults took (a worker SIGKILLed,
    SIGSTOPped or cut off from the database while it held the job: those
    rescues are no crash of the job's making), and the workers it killed are
    bounded accordingly (plus one free return each, a crash before the start
    mark was flushed). That no other job was charged is the history
    checker's: one dead before its ``max_attempts`` is a wrong outcome.
    """
    out: list[str] = []
    notes: list[str] = []
    unpinned = 0  # attempts over the bound, each one more worker killed
    by_id = {row.id: row for row in rows}
    poisons = [i for i, e in enqueuer.enqueued.items() if e.kind == "poison"]
    for job_id in poisons:
        job = jq.get_job(job_id)
        if (
            job is None
            or job.status != "dead"
            or "crashed its worker" not in (job.dead_reason or "")
        ):
            out.append(f"poison job {job_id} not dead for its crashes: {job}")
        elif job.attempt > (
            allowed := config.max_crashes
            + 1
            + (_lost_to_faults(by_id[job_id], faulted) if job_id in by_id else 0)
        ):
            unpinned += job.attempt - allowed
            # Reported, not failed: a lone attempt whose start mark could not
            # be written (the database failing as it started) runs unpinned,
            # and its crash is only a lost attempt (see Claims.started).
            errors = "; ".join(f"#{e.get('attempt')}: {e.get('error')}" for e in job.errors)
            notes.append(f"poison job {job_id} dead after {job.attempt} attempts ({errors})")
    bound = len(poisons) * (config.max_crashes + 2) + unpinned
    if workers.self_kills > bound:
        out.append(f"poison jobs killed {workers.self_kills} workers (bound {bound})")
    return out, notes


def silences(
    lives: list[Life],
    pauses: Sequence[tuple[int, float, float]],
    cuts: Sequence[tuple[int, float, float, str]] = (),
) -> dict[int, list[tuple[float, float, str]]]:
    """Worker pid -> ``(from, until, why)``: the spans in which a worker was
    silent for a reason other than a fault of its own making, each with a
    second of slack for the rescuer's pass to land. ``why``: ``"dead"``
    (SIGKILLed by the injector), ``"poisoned"`` (a poison job's self-kill),
    ``"stopped"`` (SIGSTOP until SIGCONT), ``"cut"`` (a partition, until as
    long after its heal as it lasted: its connections' packets were dropped,
    and TCP's retransmission backoff, doubling, may wait about that long
    before it sends again).
    """
    spans: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for life in lives:
        if life.died is not None:
            why = "poisoned" if life.self_killed else "dead"
            spans[life.pid].append((max(life.started, life.died - 1.0), math.inf, why))
    for pid, t0, t1 in pauses:
        spans[pid].append((t0, t1 + 1.0, "stopped"))
    for pid, t0, t1, _ in cuts:
        spans[pid].append((t0, t1 + (t1 - t0) + 1.0, "cut"))
    return dict(spans)


def fault_windows(
    lives: list[Life],
    pauses: Sequence[tuple[int, float, float]],
    cuts: Sequence[tuple[int, float, float, str]] = (),
) -> dict[int, list[tuple[float, float]]]:
    """:attr:`History.faulted`: the :func:`silences` the soak's own faults
    caused (a poison job's self-kill is not the soak's).
    """
    return {
        pid: [(start, until) for start, until, why in spans if why != "poisoned"]
        for pid, spans in silences(lives, pauses, cuts).items()
    }


def _lost_to_faults(row: Row, faulted: Mapping[int, Sequence[tuple[float, float]]]) -> int:
    """Rescues of ``row``'s job from a worker the soak itself had killed,
    stopped or cut off at the time: attempts a fault took, no crash of the
    job's own.
    """
    return sum(faulted_at(faulted, r.worker, r.at) for r in rescues_of(row))


def classify_rescues(
    rows: list[Row],
    lives: list[Life],
    pauses: list[tuple[int, float, float]],
    cuts: Sequence[tuple[int, float, float, str]] = (),
) -> dict[str, Any]:
    """Who each rescue took a job from: a SIGKILLed worker, a SIGSTOPped one,
    one cut off by a partition (see :func:`silences`), or a live one. A live
    holder (running, not stopped, reachable) must never lose its jobs, not
    even after a database outage longer than rescue_after.
    """
    counts: dict[str, Any] = {"dead": 0, "stopped": 0, "cut": 0, "live": 0, "examples": []}
    spans = silences(lives, pauses, cuts)
    for row in rows:
        for rescue in rescues_of(row):
            pid = pid_of(rescue.worker)
            held = spans.get(pid, []) if pid is not None else []
            whys = {why for start, until, why in held if start <= rescue.at <= until}
            if whys & {"dead", "poisoned"}:
                counts["dead"] += 1
            elif "stopped" in whys:
                counts["stopped"] += 1
            elif "cut" in whys:
                counts["cut"] += 1
            else:
                counts["live"] += 1
                counts["examples"].append(
                    f"job {rescue.job} attempt {rescue.attempt} from {rescue.worker}"
                )
    counts["examples"] = counts["examples"][:5]
    return counts


def _probe_down(
    pg: PrivatePostgres, config: SoakConfig, settings: dict[str, float]
) -> dict[str, Any]:
    """Stop PostgreSQL, enqueue, expect DatabaseUnavailable; start it again."""
    from jobkeeper.backends.postgres import sources as pg_sources

    token = 10**12
    saved = pg_sources.POOL_TIMEOUT
    if config.probe_pool_timeout is not None:
        pg_sources.POOL_TIMEOUT = config.probe_pool_timeout
    pg.stop("fast")
    probe_jq = JobQueue(pg.url, **settings)
    started = time.monotonic()
    try:
        probe_jq.enqueue("soak.work", {"n": token, "ms": 1})
        outcome: dict[str, Any] = {"ok": False, "detail": "enqueue returned with the database down"}
    except DatabaseUnavailable as exc:
        outcome = {"ok": True, "message": str(exc)}
    except Exception as exc:
        outcome = {"ok": False, "detail": f"raised {type(exc).__name__}: {exc}"}
    finally:
        pg_sources.POOL_TIMEOUT = saved
        probe_jq.close()
    outcome["seconds"] = time.monotonic() - started
    outcome["token"] = token
    pg.start()
    return outcome


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
        *_limits_lines(result),
        f"  executions     {s['executions']} logged, {s['executions_unfinished']} cut short by "
        f"SIGKILL, {s['re_executed_jobs']} jobs ran to success more than once",
    ]
    if result.rss.get("jobs"):
        warm = result.rss.get("warm_mib", {})
        end = result.rss.get("end_mib", {})
        per = ", ".join(f"{warm[p]:.1f}->{end.get(p, 0):.1f}" for p in sorted(warm))
        seconds = result.rss.get("seconds", 0)
        growth = _mib(result.rss.get("max_growth", 0))
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


def _interrupted(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak.run", description=__doc__)
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--minutes", type=float, default=2.0, help="length of the fault phase")
    parser.add_argument("--jobs", type=int, help="chaos jobs (default: 50 per second of faults)")
    parser.add_argument("--noop-jobs", type=int, default=200_000, help="memory phase jobs")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    parser.add_argument("--rescue-after", type=float, default=3.0)
    parser.add_argument("--fault-every", type=float, default=5.0, help="seconds between faults")
    parser.add_argument("--stop-for", type=float, help="SIGSTOP length (2 x rescue_after)")
    parser.add_argument("--rss-bound-mib", type=float, default=32.0)
    parser.add_argument(
        "--poison-jobs", type=int, default=2, help="jobs that SIGKILL their worker every attempt"
    )
    parser.add_argument("--max-crashes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="keep logs here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir with logs")
    parser.add_argument(
        "--limits",
        action="store_true",
        help="flow control on: a concurrency cap and a rate limit on the bulk queue, "
        "serial keys on default-queue jobs",
    )
    parser.add_argument("--cap", type=int, default=3, help="the bulk queue's concurrency")
    parser.add_argument("--rate", type=int, default=20, help="the bulk queue's starts per second")
    parser.add_argument(
        "--partitions",
        action="store_true",
        help="PostgreSQL: workers in network namespaces, hosts cut off both ways and one way "
        "(needs root, ip, iptables)",
    )
    args = parser.parse_args(argv)
    seconds = args.minutes * 60
    config = SoakConfig(
        backend=args.backend,
        seconds=seconds,
        jobs=args.jobs if args.jobs is not None else int(50 * seconds),
        noop_jobs=args.noop_jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        heartbeat_interval=args.heartbeat_interval,
        rescue_after=args.rescue_after,
        fault_every=args.fault_every,
        stop_for=args.stop_for,
        drain_timeout=max(300.0, args.noop_jobs / 200),
        rss_bound_mib=args.rss_bound_mib,
        poison_jobs=args.poison_jobs,
        max_crashes=args.max_crashes,
        seed=args.seed,
        keep=args.keep,
        out=args.out,
        limits=args.limits,
        cap=args.cap,
        rate_per_second=args.rate,
        partitions=args.partitions,
    )
    # SIGTERM (and SIGINT, even when started in the background, where it is
    # ignored by default) stop the run through its clean-up: the workers are
    # stopped and the private PostgreSQL is removed.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupted)
    result = run_soak(config)
    print(result.summary)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
