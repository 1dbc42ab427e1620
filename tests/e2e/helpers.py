"""Helpers of the e2e tests: worker subprocesses, and what those tests read of
the jobs they ran. Raw SQL and waiting are in ``support``."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from support.db import is_pg, sql
from support.waiting import DEADLINE

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.e2e.apps:jq"


def counts(url: str) -> dict[str, int]:
    rows = sql(url, "SELECT status, count(*) FROM jobkeeper_jobs GROUP BY status")
    out = {str(status): int(n) for status, n in rows}
    out["dead"] = int(sql(url, "SELECT count(*) FROM jobkeeper_dead_letters")[0][0])
    return out


def env_for(settings: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env["JK_E2E_SETTINGS"] = json.dumps(settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Procs:
    """Subprocesses of one test; every one is killed and reaped at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.all: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self._n = 0

    def spawn(
        self, argv: list[str], *, settings: dict[str, Any], name: str
    ) -> subprocess.Popen[bytes]:
        self._n += 1
        log = self.tmp / f"{name}-{self._n}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=env_for(settings), stdout=out, stderr=subprocess.STDOUT
            )
        self.all.append(proc)
        self.logs[proc.pid] = log
        return proc

    def worker(
        self,
        url: str,
        settings: dict[str, Any],
        *,
        concurrency: int = 4,
        burst: bool = False,
        queues: Sequence[str] = (),
        prefetch: int | None = None,
    ) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "jobkeeper", "--database", url, "worker", "--app", APP]
        argv += ["--concurrency", str(concurrency)]
        if prefetch is not None:
            argv += ["--prefetch", str(prefetch)]
        for queue in queues:
            argv += ["--queue", queue]
        if burst:
            argv.append("--burst")
        return self.spawn(argv, settings=settings, name="worker")

    def python(
        self, code: str, *args: str, settings: dict[str, Any] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.spawn([sys.executable, "-c", code, *args], settings=settings or {}, name="py")

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def cleanup(self) -> None:
        for proc in self.all:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
        for proc in self.all:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@contextlib.contextmanager
def processes(tmp: Path) -> Iterator[Procs]:
    procs = Procs(tmp)
    try:
        yield procs
    except BaseException:
        # Shown by pytest with the failure: what every process said.
        for proc in procs.all:
            print(f"----- pid {proc.pid} (exit {proc.poll()}): {proc.args}")
            print(procs.log(proc)[-6000:])
        raise
    finally:
        procs.cleanup()


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = DEADLINE) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"process {proc.pid} did not exit within {timeout}s") from None


def read_records(path: Path) -> list[tuple[int, int, int, str]]:
    """Lines ``<job id> <attempt> <pid> <event>`` written by the app's tasks."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        job_id, attempt, pid, event = line.split()
        out.append((int(job_id), int(attempt), int(pid), event))
    return out


def workers_by_pid(url: str) -> dict[int, str]:
    return {int(pid): str(wid) for wid, pid in sql(url, "SELECT id, pid FROM jobkeeper_workers")}


def holder_pid(url: str, job_id: int) -> int | None:
    """The pid of the worker holding ``job_id`` (claimed or running; from the
    host:pid:random id).
    """
    rows = sql(url, "SELECT status, worker_id FROM jobkeeper_jobs WHERE id = ?", [job_id])
    if not rows or rows[0][0] not in ("claimed", "running"):
        return None
    return int(str(rows[0][1]).split(":")[-2])


def job_window(url: str) -> tuple[float, float]:
    """(first attempted_at, last finished_at) over all jobs, Unix seconds."""
    if is_pg(url):
        query = (
            "SELECT extract(epoch FROM min(attempted_at))::float8, "
            "extract(epoch FROM max(finished_at))::float8 FROM jobkeeper_jobs"
        )
    else:
        query = "SELECT min(attempted_at), max(finished_at) FROM jobkeeper_jobs"
    start, end = sql(url, query)[0]
    return float(start), float(end)


def max_heartbeat_gap(beats: list[float], start: float, end: float) -> float:
    """Longest time in [start, end] without a heartbeat (beats sorted)."""
    before = [b for b in beats if b <= start]
    inside = [b for b in beats if start < b <= end]
    points = [before[-1] if before else float("-inf"), *inside, end]
    return max(b - a for a, b in itertools.pairwise(points))
