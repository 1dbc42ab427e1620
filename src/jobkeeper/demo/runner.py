"""``jobkeeper demo``: real work through the queue, a crash, and a reconciliation.

1. Enqueue one job per ``.py`` file of the running Python's standard library;
   about 5% fail on their first attempt and a few always fail (chosen by a
   hash of the path, so the same files every run).
2. Start worker processes; SIGKILL the first once 30% of the jobs are done.
3. The survivors rescue the killed worker's jobs once its heartbeat is
   ``rescue_after`` seconds old.
4. When every job is finished, stop the survivors with SIGTERM and account for
   every enqueued id: completed, dead, or lost (must be 0). Every completed
   result is checked against the file itself.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobkeeper.api import JobQueue
from jobkeeper.config import MAX_CONCURRENCY
from jobkeeper.demo.tasks import count_file
from jobkeeper.demo.tasks import jq as demo_jq
from jobkeeper.errors import ConfigError
from jobkeeper.models import TERMINAL_STATUSES, Job, JobStatus

DEFAULT_DEMO_URL = "sqlite:///jobkeeper-demo.db"
#: Each run uses a queue of its own, so a reused database (PostgreSQL with
#: --database) never mixes in the jobs of earlier runs.
QUEUE_PREFIX = "demo"
KILL_AT = 0.30
DEADLINE = 120.0
#: Most worker processes the demo starts.
MAX_WORKERS = 64


def stdlib_files() -> list[str]:
    """Every ``.py`` file of the running Python's standard library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        str(path)
        for path in root.rglob("*.py")
        if "site-packages" not in path.parts and "dist-packages" not in path.parts
    )


def planned_failures(path: str) -> int:
    """How many first attempts of ``path``'s job fail: 99 (always, ~0.2%),
    1 (~5%), else 0. Deterministic: a hash of the path.
    """
    digest = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big")
    if digest % 500 == 0:
        return 99
    if digest % 20 == 0:
        return 1
    return 0


def _fresh_demo_file() -> None:
    """Start the default demo database afresh (only that file: a database
    named with ``--database`` may hold the user's jobs, and the demo's own
    queue keeps its jobs apart there, as on PostgreSQL).
    """
    path = DEFAULT_DEMO_URL.split("///", 1)[1]
    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)


def _expected(path: str) -> dict[str, Any]:
    data = Path(path).read_bytes()
    return {
        "lines": len(data.splitlines()),
        "words": len(data.split()),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _start_worker(url: str, queue: str, concurrency: int, log: Any) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "jobkeeper", "--database", url, "worker",
        "--app", "jobkeeper.demo.tasks:jq", "--queue", queue,
        "--concurrency", str(concurrency),
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def _held_by_pid(jq: JobQueue, queue: str, pid: int) -> list[int]:
    """Ids of the jobs worker process ``pid`` holds (claimed or running)."""
    held = [
        job
        for status in (JobStatus.CLAIMED, JobStatus.RUNNING)
        for job in jq.list_jobs(status=status, queue=queue, limit=10_000)
    ]
    return [job.id for job in held if job.worker_id and job.worker_id.split(":")[1] == str(pid)]


def finished_by_others(held_ids: list[int], found: dict[int, Job]) -> int:
    """How many of the jobs a killed worker held were then finished (completed,
    dead or cancelled) by the other workers. Counted by id, not by a "worker
    lost" error: a claimed job that had not started is handed back without one.
    """
    return sum(
        1 for job_id in held_ids if job_id in found and found[job_id].status in TERMINAL_STATUSES
    )


def run_demo(console: Console, *, database_url: str | None, workers: int, concurrency: int) -> int:
    """Run the demo; returns the exit code (0 when every job is accounted for).

    Raises:
        ConfigError: ``workers`` is not 2..``MAX_WORKERS`` or ``concurrency``
            not 1..``MAX_CONCURRENCY``, named as the ``jobkeeper demo`` options they come
            from. Checked before anything is written: a bad concurrency used
            to be found by the workers only, after 1,790 jobs were enqueued.
    """
    if not 2 <= workers <= MAX_WORKERS:
        raise ConfigError(
            f"--workers must be between 2 and {MAX_WORKERS} (one worker is killed), got {workers}"
        )
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ConfigError(
            f"--concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}"
        )
    url = database_url or DEFAULT_DEMO_URL
    if database_url is None:
        _fresh_demo_file()
    jq = demo_jq.using(url)
    try:
        return _run(console, jq, url, workers, concurrency)
    finally:
        jq.close()


def _run(console: Console, jq: JobQueue, url: str, workers: int, concurrency: int) -> int:
    jq.migrate()
    queue = f"{QUEUE_PREFIX}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    files = stdlib_files()
    console.print(
        f"[bold]jobkeeper demo[/] on {escape(jq.url.redacted())}: {len(files)} files of "
        f"{sysconfig.get_paths()['stdlib']}, {workers} workers x {concurrency}"
    )
    started = time.monotonic()
    jobs = jq.enqueue_many(
        [
            (count_file, {"path": p, "fail_first": planned_failures(p)}, {"queue": queue})
            for p in files
        ]
    )
    enqueued = {job.id: job.args["path"] for job in jobs if job.args is not None}
    console.print(f"enqueued {len(enqueued)} jobs in {time.monotonic() - started:.2f}s")

    log_path = Path("jobkeeper-demo.log")
    killed_pid = 0
    held_at_kill: list[int] = []
    with log_path.open("wb") as log:
        procs = [_start_worker(url, queue, concurrency, log) for _ in range(workers)]
        try:
            finished = _watch(console, jq, queue, len(enqueued), procs, kill_at=KILL_AT)
            killed_pid, held_at_kill = finished
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            exit_codes = [proc.wait(timeout=30) for proc in procs]
    wall = time.monotonic() - started
    return _reconcile(
        console, jq, queue, enqueued, wall, killed_pid, held_at_kill, exit_codes, log_path
    )


def _watch(
    console: Console,
    jq: JobQueue,
    queue: str,
    total: int,
    procs: list[subprocess.Popen[bytes]],
    *,
    kill_at: float,
) -> tuple[int, list[int]]:
    """Show progress until every job is finished; SIGKILL ``procs[0]`` at
    ``kill_at``; returns its pid and the ids of the jobs it held then.
    """
    killed_pid, held = 0, []
    deadline = time.monotonic() + DEADLINE
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("jobs finished", total=total)
        while time.monotonic() < deadline:
            counts = jq.stats().get(queue, {})
            done = counts.get("completed", 0) + counts.get("dead", 0)
            progress.update(bar, completed=done)
            if not killed_pid and done >= kill_at * total:
                victim = procs[0]
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                killed_pid = victim.pid
                # Counted after the kill: exactly what the dead worker held
                # (claimed, running or with its ack unwritten).
                held = _held_by_pid(jq, queue, victim.pid)
                progress.console.print(
                    f"[yellow]SIGKILLed worker pid {killed_pid} holding {len(held)} jobs "
                    "(claimed or running)[/]"
                )
            if done >= total:
                break
            if all(proc.poll() is not None for proc in procs):
                progress.console.print("[red]every worker has exited: see jobkeeper-demo.log[/]")
                break
            time.sleep(0.2)
    return killed_pid, held


def _reconcile(
    console: Console,
    jq: JobQueue,
    queue: str,
    enqueued: dict[int, str],
    wall: float,
    killed_pid: int,
    held_at_kill: list[int],
    exit_codes: list[int],
    log_path: Path,
) -> int:
    # Both tables: live jobs and dead letters (the demo has fewer than 10,000).
    found = {job.id: job for job in jq.list_jobs(queue=queue, limit=10_000)}
    by_status: dict[str, int] = {}
    for job_id in enqueued:
        entry = found.get(job_id)
        key = entry.status.value if entry else "lost"
        by_status[key] = by_status.get(key, 0) + 1
    completed = [
        found[i] for i in enqueued if i in found and found[i].status == JobStatus.COMPLETED
    ]
    retried = sum(1 for job in completed if job.errors)
    rescued = finished_by_others(held_at_kill, found)
    verified = sum(1 for job in completed if job.result == _expected(enqueued[job.id]))
    lost = by_status.get("lost", 0)
    unfinished = sum(
        by_status.get(s.value, 0)
        for s in JobStatus
        if s not in (JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED)
    )
    dead = by_status.get("dead", 0)
    expected_dead = sum(1 for path in enqueued.values() if planned_failures(path) == 99)

    table = Table(title="reconciliation", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("count", justify="right")
    rows = [
        ("enqueued", len(enqueued)),
        ("completed", len(completed)),
        ("  results verified against the files", verified),
        ("  retried, then completed", retried),
        ("held by the killed worker, finished by the others", rescued),
        (f"dead (always-failing, expected {expected_dead})", dead),
        ("cancelled", by_status.get("cancelled", 0)),
        ("unfinished", unfinished),
        ("lost", lost),
    ]
    for what, count in rows:
        table.add_row(what, str(count))
    console.print(table)
    accounted = len(completed) + dead + by_status.get("cancelled", 0) + unfinished + lost
    ok = (
        lost == 0
        and unfinished == 0
        and accounted == len(enqueued)
        and verified == len(completed)
        and dead == expected_dead
    )
    console.print(
        f"killed worker pid {killed_pid} held {len(held_at_kill)} jobs (claimed or running); "
        f"surviving workers exited with {exit_codes[1:]} after SIGTERM"
    )
    console.print(
        f"completed + dead + cancelled + unfinished + lost = {accounted} of {len(enqueued)}"
    )
    console.print(
        f"wall time: {wall:.1f}s, {len(enqueued) / wall:.0f} jobs/s (worker log: {log_path})"
    )
    console.print(f"lost: {lost}")
    console.print("[green]every job accounted for[/]" if ok else "[red]RECONCILIATION FAILED[/]")
    return 0 if ok else 1
