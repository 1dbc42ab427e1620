"""Fault injectors: worker processes (SIGKILL + restart, SIGSTOP + SIGCONT),
the database (``pg_terminate_backend``, restarts of the private PostgreSQL),
and partitions (a worker host cut off both ways, or one way, then healed; the
workers then run in network namespaces, see :mod:`benchmarks.soak.netns`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import psycopg

from benchmarks.soak.netns import Hosts
from benchmarks.soak.pg import PrivatePostgres

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Life:
    """One worker process: when it started and (if SIGKILLed) died."""

    slot: int
    pid: int
    started: float
    died: float | None = None
    #: When it exited, as a watcher thread saw it (the driver's main loop
    #: notices an exit only between faults, up to a fault's length late).
    exited_at: float | None = None
    killed: bool = False
    exit_code: int | None = None
    #: Killed by a poison job it ran (not by the fault injector).
    self_killed: bool = False


class Workers:
    """Worker subprocesses (``python -m jobkeeper ... worker``) in numbered slots.

    Args:
        url: the database URL.
        count: worker processes.
        concurrency: ``--concurrency`` of each.
        queues: ``--queue`` values.
        env: extra environment (the soak settings, ``SOAK_LOG_DIR``).
        log_dir: where each process's stderr goes.
        app: the ``--app`` spec.
        hosts: network namespaces (:mod:`benchmarks.soak.netns`): slot ``i``
            runs in ``hosts[i]`` and reaches the database at its gateway
            (``url`` must then name 127.0.0.1, which is replaced).
        extra_args: more ``worker`` options (``--prefetch 3``).
    """

    def __init__(
        self,
        url: str,
        count: int,
        concurrency: int,
        queues: list[str],
        env: dict[str, str],
        log_dir: Path,
        app: str = "benchmarks.soak.app:jq",
        hosts: Hosts | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.url = url
        self.hosts = hosts
        self.extra_args = list(extra_args)
        self.count = count
        self.concurrency = concurrency
        self.queues = queues
        self.env = {
            **os.environ,
            **env,
            "PYTHONPATH": str(ROOT),
            "JOBKEEPER_DATABASE_URL": url,
        }
        self.log_dir = log_dir
        self.app = app
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.lives: list[Life] = []
        self._current: dict[int, Life] = {}
        self.unexpected: list[str] = []
        self._lock = threading.Lock()
        self._generation = Counter[int]()
        self._crashes = Counter[int]()
        self.paused: set[int] = set()
        #: Whether a worker that dies of SIGKILL on its own is expected (the
        #: run has poison jobs, which kill their worker), and how many did.
        self.self_kills_expected = False
        self.self_kills = 0

    def url_of(self, slot: int) -> str:
        """The database URL as the slot's worker reaches it."""
        if self.hosts is None:
            return self.url
        return self.url.replace("@127.0.0.1:", f"@{self.hosts[slot].gateway}:", 1)

    def command(self, slot: int = 0) -> list[str]:
        url = self.url_of(slot)
        cmd = [sys.executable, "-m", "jobkeeper", "--database", url, "worker"]
        cmd += ["--app", self.app, "--concurrency", str(self.concurrency)]
        for queue in self.queues:
            cmd += ["--queue", queue]
        cmd += self.extra_args
        return cmd if self.hosts is None else self.hosts[slot].wrap(cmd)

    def start(self, slot: int) -> None:
        with self._lock:
            self._generation[slot] += 1
            log = self.log_dir / f"worker-{slot}-{self._generation[slot]}.log"
            with log.open("wb") as stderr:
                proc = subprocess.Popen(
                    self.command(slot),
                    cwd=ROOT,
                    env={**self.env, "JOBKEEPER_DATABASE_URL": self.url_of(slot)},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                )
            self.procs[slot] = proc
            life = Life(slot, proc.pid, time.time())
            self.lives.append(life)
            self._current[slot] = life
        threading.Thread(target=self._watch, args=(proc, life), daemon=True).start()

    @staticmethod
    def _watch(proc: subprocess.Popen[bytes], life: Life) -> None:
        # A worker a poison job killed died when it did, not when check()
        # got to it: a rescue of its jobs in between is not from a live one.
        proc.wait()
        life.exited_at = time.time()

    def start_all(self) -> None:
        for slot in range(self.count):
            self.start(slot)

    def pids(self) -> dict[int, int]:
        with self._lock:
            return {slot: proc.pid for slot, proc in self.procs.items() if proc.poll() is None}

    def kill(self, slot: int) -> None:
        """SIGKILL the slot's process and reap it."""
        with self._lock:
            proc = self.procs[slot]
            life = self._current[slot]
            life.died = time.time()
            life.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        with self._lock:
            life.exit_code = proc.returncode
            self.paused.discard(slot)

    def pause(self, slot: int) -> None:
        with self._lock:
            self.paused.add(slot)
            os.kill(self.procs[slot].pid, signal.SIGSTOP)

    def resume(self, slot: int) -> None:
        with self._lock:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.procs[slot].pid, signal.SIGCONT)
            self.paused.discard(slot)

    #: Restarts of a slot whose worker keeps exiting on its own (a crash loop).
    MAX_RESTARTS = 3

    def check(self) -> None:
        """Record (and restart, a few times) any worker that exited without
        being killed: a crash or a crash loop is a soak failure.
        """
        with self._lock:
            exited = [
                (slot, proc)
                for slot, proc in self.procs.items()
                if proc.poll() is not None and not self._current[slot].killed
            ]
        for slot, proc in exited:
            life = self._current[slot]
            life.exit_code = proc.returncode
            life.died = life.exited_at or time.time()
            life.killed = True  # not again
            if self.self_kills_expected and proc.returncode == -signal.SIGKILL:
                # A poison job killed it: the driver bounds how often.
                life.self_killed = True
                self.self_kills += 1
                self.start(slot)
                continue
            tail = self.log_tail(slot)
            self.unexpected.append(
                f"worker slot {slot} pid {proc.pid} exited {proc.returncode}:\n{tail}"
            )
            self._crashes[slot] += 1
            if self._crashes[slot] <= self.MAX_RESTARTS:
                self.start(slot)

    def alive(self) -> int:
        """Worker processes running now."""
        with self._lock:
            return sum(1 for proc in self.procs.values() if proc.poll() is None)

    def log_tail(self, slot: int, lines: int = 15) -> str:
        log = self.log_dir / f"worker-{slot}-{self._generation[slot]}.log"
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop_all(self, timeout: float) -> dict[int, int | None]:
        """SIGTERM every worker (resuming paused ones); their exit codes."""
        for slot in list(self.paused):
            self.resume(slot)
        with self._lock:
            procs = dict(self.procs)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[int, int | None] = {}
        deadline = time.monotonic() + timeout
        for slot, proc in procs.items():
            try:
                codes[slot] = proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[slot] = None
        return codes

    def logs(self) -> list[Path]:
        return sorted(self.log_dir.glob("worker-*.log"))


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (from /proc), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Faults:
    """Injects one fault at a time, in a rotation, and counts them.

    Args:
        workers: the worker processes.
        pg: the private PostgreSQL (``None`` on SQLite: worker faults only).
        rng: the soak's random source.
        stop_for: seconds a SIGSTOPped worker stays stopped.
        long_outage: seconds PostgreSQL stays down in a long outage (longer
            than rescue_after: no live worker can heartbeat meanwhile).
        restart_pause: seconds PostgreSQL stays down during a restart.
        partitions: add the partition kinds (cut a worker host off both
            ways, only its outgoing or only its incoming packets, for
            ``stop_for`` seconds, then heal); the workers must run in
            namespaces (``Workers(hosts=...)``).
    """

    #: Every kind comes once in the first seven faults (the short soak sees all).
    PG_ROTATION = (
        "kill",
        "terminate",
        "pg_restart_fast",
        "stop",
        "pg_kill9",
        "pg_crash_immediate",
        "pg_outage_long",
        "kill",
        "terminate",
        "kill",
        "stop",
    )
    SQLITE_ROTATION = ("kill", "stop", "kill", "kill", "stop")
    #: The PostgreSQL rotation with partitions: every kind in the first ten.
    PARTITION_ROTATION = (
        "kill",
        "cut_both",
        "terminate",
        "pg_restart_fast",
        "cut_out",
        "stop",
        "pg_kill9",
        "cut_in",
        "pg_crash_immediate",
        "pg_outage_long",
        "kill",
        "cut_both",
        "terminate",
        "cut_in",
        "kill",
        "cut_out",
        "stop",
    )

    def __init__(
        self,
        workers: Workers,
        pg: PrivatePostgres | None,
        rng: random.Random,
        stop_for: float,
        long_outage: float,
        restart_pause: float = 0.5,
        partitions: bool = False,
    ) -> None:
        self.workers = workers
        self.pg = pg
        self.rng = rng
        self.stop_for = stop_for
        self.long_outage = long_outage
        #: (pid, stopped, continued) of every SIGSTOP.
        self.pauses: list[tuple[int, float, float]] = []
        self.restart_pause = restart_pause
        self.counts: Counter[str] = Counter()
        self.terminated_connections = 0
        self.db_down = threading.Event()
        self.outages: list[tuple[float, float]] = []
        self.log: list[tuple[float, str]] = []
        #: (pid, cut, healed, kind) of every partition.
        self.cuts: list[tuple[int, float, float, str]] = []
        if partitions:
            if pg is None or workers.hosts is None:
                raise ValueError("partitions need PostgreSQL and workers in namespaces")
            self._rotation = self.PARTITION_ROTATION
        else:
            self._rotation = self.PG_ROTATION if pg is not None else self.SQLITE_ROTATION
        self._next = 0

    def inject_next(self) -> str:
        kind = self._rotation[self._next % len(self._rotation)]
        self._next += 1
        getattr(self, f"_{kind}")()
        self.counts[kind] += 1
        self.log.append((time.time(), kind))
        return kind

    def _slot(self) -> int:
        return self.rng.randrange(self.workers.count)

    def _kill(self) -> None:
        slot = self._slot()
        self.workers.kill(slot)
        time.sleep(self.rng.uniform(0.0, 0.5))
        self.workers.start(slot)

    def _stop(self) -> None:
        slot = self._slot()
        pid = self.workers.pids()[slot]
        stopped = time.time()
        self.workers.pause(slot)
        time.sleep(self.stop_for)
        self.workers.resume(slot)
        self.pauses.append((pid, stopped, time.time()))

    def _cut(self, kind: str) -> None:
        assert self.workers.hosts is not None
        slot = self._slot()
        pid = self.workers.pids()[slot]
        host = self.workers.hosts[slot]
        cut = time.time()
        host.cut(kind)
        try:
            time.sleep(self.stop_for)
        finally:
            host.heal()
            self.cuts.append((pid, cut, time.time(), kind))

    def _cut_both(self) -> None:
        self._cut("both")

    def _cut_out(self) -> None:
        self._cut("out")

    def _cut_in(self) -> None:
        self._cut("in")

    @property
    def rotation(self) -> tuple[str, ...]:
        return self._rotation

    def _terminate(self) -> None:
        assert self.pg is not None
        with psycopg.connect(self.pg.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'"
            ).fetchone()
        self.terminated_connections += int(row[0]) if row else 0

    def _outage(self, stop: str, pause: float | None = None) -> None:
        assert self.pg is not None
        self.db_down.set()
        down = time.time()
        try:
            if stop == "kill9":
                self.pg.kill9()
            else:
                self.pg.stop(stop)
            time.sleep(self.restart_pause if pause is None else pause)
        finally:
            self.pg.start()
            self.db_down.clear()
            self.outages.append((down, time.time()))

    def _pg_restart_fast(self) -> None:
        self._outage("fast")

    def _pg_crash_immediate(self) -> None:
        self._outage("immediate")

    def _pg_kill9(self) -> None:
        self._outage("kill9")

    def _pg_outage_long(self) -> None:
        self._outage("fast", self.long_outage)
