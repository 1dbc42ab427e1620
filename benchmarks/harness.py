"""Plumbing shared by the measurements: fresh databases, worker processes,
polling, statistics. Nothing here measures anything by itself.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import secrets
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
PG_URL_ENV = "JOBKEEPER_BENCH_PG_URL"
DB_PREFIX = "jkbench_"


class NotAvailableError(Exception):
    """A figure that could not be measured; the message says why (printed as n/a)."""


def failure_reason(exc: BaseException) -> str:
    """How a measurement that raised ``exc`` is reported: a NotAvailableError's
    own words, else the exception's type and the first line of its text."""
    if isinstance(exc, NotAvailableError):
        return str(exc)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def log(message: str) -> None:
    """Progress goes to stderr; the table goes to stdout."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- statistics ---------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- PostgreSQL databases -----------------------------------------------------


def with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def pid_exists(pid: int) -> bool:
    """Whether any process (a zombie included) has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def connect_patiently(url: str, timeout: float = 120.0) -> psycopg.Connection[Any]:
    """Connect, waiting out a full server ("too many clients": the server may
    be shared with test suites) for up to ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    delay = 0.5
    while True:
        try:
            return psycopg.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            if "too many clients" not in str(exc) or time.monotonic() > deadline:
                raise
            log(f"server full ({str(exc).strip().splitlines()[-1]}); retrying in {delay:.1f}s")
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


@dataclass
class PgServer:
    """The PostgreSQL server every library is measured on.

    ``admin_url`` names any database we may connect to; each measurement gets
    a database of its own, created fresh (``jkbench_<pid>_<n>_<label>``) and
    dropped afterwards.
    """

    admin_url: str
    _counter: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _created: list[str] = field(default_factory=list)

    def admin(self) -> psycopg.Connection[Any]:
        return connect_patiently(self.admin_url)

    def describe(self) -> dict[str, Any]:
        names = (
            "server_version",
            "synchronous_commit",
            "fsync",
            "autovacuum",
            "shared_buffers",
            "max_connections",
            "wal_level",
        )
        with self.admin() as conn:
            rows = conn.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)", (list(names),)
            ).fetchall()
        settings = {
            name: f"{value}{'' if unit is None else ' ' + unit}" for name, value, unit in rows
        }
        parts = urlsplit(self.admin_url)
        return {"host": parts.hostname, "port": parts.port or 5432, "settings": settings}

    def checkpoint(self) -> None:
        """Write back every dirty page now (``CHECKPOINT``, a superuser's or a
        pg_checkpoint member's), so that what came before (databases made
        and dropped, fills) is not written back during what comes next."""
        with self.admin() as conn:
            conn.execute("CHECKPOINT")

    def drop_stale(self) -> None:
        """Drop benchmark databases left by runs that are no longer alive."""
        with self.admin() as conn:
            names = [
                row[0]
                for row in conn.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s", (DB_PREFIX + "%",)
                )
            ]
            for name in names:
                match = re.match(rf"{DB_PREFIX}(\d+)_", name)
                if match and not pid_exists(int(match.group(1))):
                    log(f"dropping stale database {name}")
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def create(self, label: str) -> str:
        """Create an empty database; returns its URL."""
        safe = re.sub(r"[^a-z0-9_]", "_", label.lower())[:30]
        name = f"{DB_PREFIX}{os.getpid()}_{next(self._counter)}_{safe}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self._created.append(name)
        return with_dbname(self.admin_url, name)

    def drop(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._created:
            self._created.remove(name)

    @contextlib.contextmanager
    def fresh(self, label: str) -> Iterator[str]:
        url = self.create(label)
        try:
            yield url
        finally:
            self.drop(url)

    def drop_all(self) -> None:
        for name in list(self._created):
            with contextlib.suppress(psycopg.Error):
                self.drop(with_dbname(self.admin_url, name))


@contextlib.contextmanager
def fresh_sqlite(label: str) -> Iterator[str]:
    """A fresh SQLite file in a temporary directory; yields its ``sqlite:///`` URL."""
    with tempfile.TemporaryDirectory(prefix=f"jkbench-{label}-") as directory:
        yield f"sqlite:///{directory}/bench.db"


@contextlib.contextmanager
def scratch_database(backend: str, pg_url: str) -> Iterator[str]:
    """A URL of an empty jobkeeper database for one benchmark, gone after:
    a SQLite file in a temporary directory, or a PostgreSQL schema of its
    own on ``pg_url`` (the URL's ``search_path``), dropped with its tables.
    """
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            yield f"sqlite:///{directory}/bench.db"
        return
    schema = f"jk_bench_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{separator}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def sqlite_connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(sqlite_path(url), timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


# -- worker processes ---------------------------------------------------------


class WorkerProcess:
    """A worker subprocess started in the repository root, its output in a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        full_env = dict(os.environ)
        full_env.update(env)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [full_env.get("PYTHONPATH")])]
        )
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise NotAvailableError(f"worker exited with code {code}: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text[-lines:]) or "(empty log)"

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"worker {self.pid} ignored SIGTERM for {timeout}s; killing it")
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class DrainTrace:
    """When a backlog started moving and when it was gone (perf_counter seconds)."""

    started: float
    first_progress: float | None
    done: float | None
    remaining: int
    #: Jobs still left when ``first_progress`` was seen: the jobs done after it.
    left_at_first: int | None = None


def wait_drained(
    remaining: Callable[[], int],
    total: int,
    worker: WorkerProcess,
    *,
    timeout: float,
    interval: float = 0.05,
    start_interval: float = 0.01,
    on_sample: Callable[[float, int], None] | None = None,
) -> DrainTrace:
    """Poll ``remaining()`` until it is 0 (or ``timeout`` passes); every
    ``start_interval`` seconds until the first jobs are done (the start-up is
    timed to that), every ``interval`` after, and more often as the end
    draws near (see :func:`next_poll`).
    """
    first: float | None = None
    left_at_first: int | None = None
    left = total
    deadline = worker.started + timeout
    while True:
        left = remaining()
        now = time.perf_counter()
        if on_sample is not None:
            on_sample(now, left)
        if first is None and left < total:
            first, left_at_first = now, left
        if left == 0:
            return DrainTrace(worker.started, first, now, 0, left_at_first)
        if now > deadline:
            return DrainTrace(worker.started, first, None, left, left_at_first)
        worker.check_alive()
        if first is None or left_at_first is None:
            time.sleep(start_interval)
        else:
            time.sleep(next_poll(now - first, left_at_first - left, left, interval))


#: Shortest pause between two polls of a drain near its end (seconds).
END_POLL = 0.002


def next_poll(since_first: float, done_since: int, left: int, interval: float) -> float:
    """The pause before the next poll of a drain whose worker did
    ``done_since`` jobs in the ``since_first`` seconds since its first ones,
    with ``left`` to go: half the time its rate says is left, between
    ``END_POLL`` and ``interval``. Polled every ``interval`` (50 ms), a
    drain's end was seen 25 ms late on average, 3 % of a 20,000-job drain at
    27,000 jobs/s, while the raw drain it is compared with times itself
    exactly; the polls near the end cost each library the same.
    """
    if done_since <= 0 or since_first <= 0:
        return interval
    eta = left * since_first / done_since
    return min(interval, max(END_POLL, eta / 2))


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def read_stamps(path: Path) -> dict[int, tuple[float, float]]:
    """``{i: (enqueued_at, started_at)}`` from a stamp file (first start wins)."""
    stamps: dict[int, tuple[float, float]] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return stamps
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            i = int(parts[0])
            stamps.setdefault(i, (float(parts[1]), float(parts[2])))
    return stamps


def python_bin(name: str) -> str:
    """A console script of this interpreter's environment (e.g. ``jobkeeper``)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name
