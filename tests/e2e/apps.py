"""The JobQueue app that e2e worker subprocesses load:

    python -m jobkeeper --database URL worker --app tests.e2e.apps:jq

Settings come from ``$JK_E2E_SETTINGS`` (a JSON object of JobQueue keyword
arguments), so each test picks its own timings. Tasks that take ``record``
append one line ``<job id> <attempt> <pid> <event>`` to that file with
O_APPEND (one ``write`` per line, so lines of concurrent processes never mix).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from jobkeeper import JobQueue, current_job

SETTINGS: dict[str, Any] = json.loads(os.environ.get("JK_E2E_SETTINGS", "{}"))
jq = JobQueue(os.environ.get("JK_E2E_DATABASE", "sqlite:///unused-e2e.db"), **SETTINGS)


def note(record: str | None, event: str) -> None:
    if not record:
        return
    here = current_job()
    line = f"{here.id} {here.attempt} {os.getpid()} {event}\n".encode()
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@jq.task(max_attempts=5)
def sleep(seconds: float, record: str | None = None) -> dict[str, Any]:
    note(record, "start")
    time.sleep(seconds)
    note(record, "end")
    return {"pid": os.getpid(), "attempt": current_job().attempt}


@jq.task(max_attempts=5)
async def asleep(seconds: float, record: str | None = None) -> dict[str, Any]:
    note(record, "start")
    await asyncio.sleep(seconds)
    note(record, "end")
    return {"pid": os.getpid(), "attempt": current_job().attempt}


@jq.task(max_attempts=5)
def naps(seconds: float, record: str | None = None) -> dict[str, Any]:
    """Sleeps in short naps: an interrupt lands between two."""
    note(record, "start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    note(record, "end")
    return {"pid": os.getpid(), "attempt": current_job().attempt}


@jq.task(max_attempts=5)
def stuck_once(seconds: float, record: str | None = None) -> int:
    """The first attempt sleeps ``seconds`` in one C call, out of any
    interrupt's reach (``select``: unlike ``time.sleep``, which an interrupt
    ends in a worker); later attempts return at once.
    """
    note(record, "start")
    if current_job().attempt == 1:
        select.select([], [], [], seconds)
    note(record, "end")
    return current_job().attempt


@jq.task(max_attempts=5)
def busy(seconds: float, record: str | None = None) -> dict[str, Any]:
    """CPU-bound: holds the GIL except at the interpreter's switch points."""
    note(record, "start")
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    note(record, "end")
    return {"pid": os.getpid(), "loops": n}


@jq.task(max_attempts=5)
def record(record: str, n: int = 0, gate: str | None = None) -> int:
    """Notes its run; with ``gate``, first waits (up to a minute) for that file."""
    if gate is not None:
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
    note(record, "run")
    return n


@jq.task(max_attempts=3)
def suicide(record: str | None = None) -> None:
    """A poison job: kills its own worker process."""
    note(record, "start")
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


@jq.task(max_attempts=20, max_crashes=2)
def poison(delay: float, record: str | None = None) -> None:
    """A poison job with a crash budget: kills its own worker ``delay``
    seconds into every attempt (long enough for jobs beside it to be running).
    """
    note(record, "start")
    time.sleep(delay)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


@jq.task(max_attempts=5)
def slept(seconds: float, record: str | None = None, fail_on: int = 0) -> int:
    """Sleeps ``seconds``; raises on attempt ``fail_on`` (after the nap)."""
    note(record, "start")
    time.sleep(seconds)
    note(record, "end")
    if current_job().attempt == fail_on:
        raise RuntimeError(f"fails on attempt {fail_on}")
    return current_job().attempt


@jq.task(max_attempts=5)
def pool_hold(seconds: float, record: str | None = None) -> float:
    """PostgreSQL: does ``seconds`` of server-side work on one of the queue's
    own pooled connections (a test hook: the way a task given connections
    from the API pool by a helper would hold them), then enqueues a follow-up
    through the API (``followups`` queue) on the same pool. Returns when it
    returned (Unix seconds).
    """
    note(record, "run")
    with jq.backend._source.connection() as conn:  # type: ignore[attr-defined]
        conn.execute("SELECT pg_sleep(%s)", [seconds])
    jq.enqueue("record", {"record": "-"}, queue="followups")
    return time.time()


@jq.task(max_attempts=5)
def close_stderr() -> str:
    """Closes the process's ``sys.stderr``, where the worker's log handler writes."""
    sys.stderr.close()
    return "closed"


@jq.task(max_attempts=5)
def leave_thread(seconds: float) -> str:
    """Starts a non-daemon thread that outlives the job by ``seconds``."""
    thread = threading.Thread(
        target=time.sleep, args=(seconds,), name="left-by-a-task", daemon=False
    )
    thread.start()
    return "left"


@jq.task(max_attempts=10, max_crashes=1)
def blocked_in_c(seconds: float, record: str | None = None) -> None:
    """Blocks in C (``select``), where no interrupt reaches it: a stopping
    worker gives up on it after its grace period.
    """
    note(record, "start")
    select.select([], [], [], seconds)


@jq.task(max_attempts=5)
async def enqueue_follow_ups(count: int) -> int:
    """Enqueues ``count`` jobs (queue ``followups``) with ``enqueue_async``:
    on PostgreSQL they open the queue's async pool on the worker's task loop.
    """
    for n in range(count):
        await jq.enqueue_async("record", {"record": "-", "n": n}, queue="followups")
    return count
