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
import functools
import logging
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.soak import instrument, netns
from benchmarks.soak.config import SoakConfig, SoakResult
from benchmarks.soak.enqueuer import Enqueuer
from benchmarks.soak.faults import Faults, Workers, rss_bytes
from benchmarks.soak.history import (
    Expected,
    History,
    Row,
    check,
    deaths_by_pid,
    read_exec_logs,
)
from benchmarks.soak.holders import classify_rescues, fault_windows, lost_to_faults
from benchmarks.soak.pg import PrivatePostgres
from benchmarks.soak.probe import probe_down
from benchmarks.soak.requeuer import CLI_TIMEOUT, Requeuer
from benchmarks.soak.summary import mib, summarize
from jobkeeper import DatabaseError, JobQueue

QUEUES = ["default", "bulk", "noop"]
#: Worker log lines that are a failure wherever they appear.
FORBIDDEN_LOG_TEXT = ("Traceback", "prepared statement", "unexpected error")


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
        enqueuer = Enqueuer(jq, rng, faults, serial)
        enqueuer.special()
        workers.self_kills_expected = config.poison_jobs > 0
        enqueuer.poison(config.poison_jobs)

        # -- the fault phase ------------------------------------------------------
        stop = threading.Event()
        feeder = threading.Thread(
            target=enqueuer.run, args=(config.jobs, config.seconds, stop), daemon=True
        )
        feeder.start()
        requeuer = Requeuer(
            jq, url, random.Random(config.seed + 1), enqueuer.enqueued, every=config.requeue_every
        )
        requeue_thread = threading.Thread(target=requeuer.run, args=(stop,), daemon=True)
        if config.requeue_every > 0:
            requeue_thread.start()
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
        if requeue_thread.is_alive():
            requeue_thread.join(timeout=2 * CLI_TIMEOUT + 10)  # a requeue after the drain: lost
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
                    f"worker RSS grew {mib(rss['max_growth'])} over the no-op phase "
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
            probe = probe_down(pg, config, settings)
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
            requeues=list(requeuer.requeues),
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
        if requeuer.errors:
            failures.append(f"{len(requeuer.errors)} requeue calls failed: {requeuer.errors[:3]}")
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
            requeues=requeuer.stats(),
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
    enqueuer: Enqueuer,
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
            + (lost_to_faults(by_id[job_id], faulted) if job_id in by_id else 0)
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
    parser.add_argument(
        "--requeue-every", type=float, default=2.0, help="seconds between requeues (0: none)"
    )
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
        requeue_every=args.requeue_every,
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
