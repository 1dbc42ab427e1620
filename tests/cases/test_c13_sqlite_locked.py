"""C-13 (huey#445, solid_queue#309/#385): SQLite's one write lock, held by
another process, must not surface as "database is locked" in enqueue,
dequeue or heartbeats.

Scaled down from the case (4 workers x 8, 4 enqueuers at 200 jobs/s for two
minutes): 2 worker processes x concurrency 4, 2 enqueuer processes adding
jobs one call at a time for ~20 s, the ``status`` CLI run again and again, and
a 5th process that takes the write lock (``BEGIN IMMEDIATE``) for 2 s every
3.5 s. No enqueue call fails, every job runs exactly once, no job is rescued
and no heartbeat gap comes near ``rescue_after``. A lock held past
``busy_timeout`` fails the call with a clear error and writes nothing.
"""

from __future__ import annotations

import itertools
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.helpers import ROOT, counts, env_for, processes, read_records, wait_exit
from jobkeeper import JobQueue
from jobkeeper.errors import DatabaseUnavailable
from support.db import sql
from support.heartbeats import heartbeat_log, install_heartbeat_log
from support.settings import FAST
from support.waiting import wait_for

pytestmark = pytest.mark.slow

#: Seconds the enqueuers run, their pace (jobs per second, each), and so
#: how many jobs each adds.
ENQUEUE_FOR = 20.0
RATE = 40.0
PER_ENQUEUER = int(ENQUEUE_FOR * RATE)
#: The lock holder: the write lock held HOLD seconds, every EVERY seconds.
HOLD = 2.0
EVERY = 3.5
SETTINGS = {**FAST, "heartbeat_interval": 0.5, "rescue_after": 10.0, "busy_timeout": 5.0}

ENQUEUER = """
import json, sys, time
from jobkeeper import JobQueue
url, record, first, rate, total, out = sys.argv[1:]
jq = JobQueue(url, busy_timeout=5.0)
ids, errors, slowest = [], [], 0.0
start = time.monotonic()
for k in range(int(total)):
    pause = start + k / float(rate) - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    began = time.monotonic()
    try:
        ids.append(jq.enqueue("record", {"record": record, "n": int(first) + k}).id)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    slowest = max(slowest, time.monotonic() - began)
jq.close()
with open(out, "w") as f:
    json.dump({"ids": ids, "errors": errors, "slowest": slowest}, f)
"""

LOCKER = """
import sqlite3, sys, time
path, hold, every, seconds, out = sys.argv[1:]
conn = sqlite3.connect(path, isolation_level=None, timeout=60)
holds = 0
end = time.monotonic() + float(seconds)
while time.monotonic() < end:
    time.sleep(float(every) - float(hold))
    conn.execute("BEGIN IMMEDIATE")
    time.sleep(float(hold))
    conn.execute("ROLLBACK")
    holds += 1
    with open(out, "w") as f:
        f.write(str(holds))
"""


def test_c13_write_lock_holds_never_reach_enqueue_heartbeats_or_status(sqlite_url, tmp_path):
    with JobQueue(sqlite_url, **SETTINGS) as jq:
        _run_under_lock_holds(jq, sqlite_url, tmp_path)


def _run_under_lock_holds(jq: JobQueue, sqlite_url: str, tmp_path: Path) -> None:
    jq.migrate()
    install_heartbeat_log(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    record = tmp_path / "runs.log"
    statuses: list[tuple[int, str]] = []
    with processes(tmp_path) as procs:
        workers = [procs.worker(sqlite_url, SETTINGS, concurrency=4) for _ in range(2)]
        wait_for(lambda: len(jq.workers()) == 2, what="both workers registered")
        outs = [tmp_path / f"enqueuer-{n}.json" for n in range(2)]
        enqueuers = [
            procs.python(
                ENQUEUER, *map(str, (sqlite_url, record, n * 10**6, RATE, PER_ENQUEUER, out))
            )
            for n, out in enumerate(outs)
        ]
        held = tmp_path / "holds"
        locker = procs.python(LOCKER, path, str(HOLD), str(EVERY), str(ENQUEUE_FOR), str(held))
        # The status CLI, again and again while the others run.
        while any(p.poll() is None for p in enqueuers):
            done = subprocess.run(
                [sys.executable, "-m", "jobkeeper", "--database", sqlite_url, "status"],
                cwd=ROOT,
                env=env_for({}),
                capture_output=True,
                text=True,
                timeout=60,
            )
            statuses.append((done.returncode, done.stdout + done.stderr))
            time.sleep(0.5)
        for proc in [*enqueuers, locker]:
            assert wait_exit(proc) == 0, procs.log(proc)
        reports = [json.loads(out.read_text()) for out in outs]
        ids = [i for report in reports for i in report["ids"]]

        wait_for(
            lambda: counts(sqlite_url).get("completed", 0) == len(ids),
            timeout=120,
            what=f"all {len(ids)} jobs completed",
        )
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            assert wait_exit(worker) == 0, procs.log(worker)
        logs = "".join(procs.log(w) for w in workers)

    holds = int(held.read_text())
    assert holds >= 4, f"the lock was held only {holds} times: the test proved nothing"
    slowest = max(report["slowest"] for report in reports)
    for report in reports:
        assert report["errors"] == [], (slowest, report["errors"][:5])
    assert len(ids) == 2 * PER_ENQUEUER
    # Some enqueues waited out a hold (the contention was real), and none
    # waited through two: a waiter gets the lock in the 1.5 s between holds.
    # SQLite's busy handler alone polled every 100 ms and lost each release
    # to newcomers: 2.6 to 5.2 s was measured, 2.2 to 2.4 s with the fix.
    assert HOLD / 4 <= slowest < 2 * HOLD, slowest
    assert statuses and all(rc == 0 for rc, _ in statuses), statuses
    assert not [out for _, out in statuses if "locked" in out]

    # Every job ran exactly once, on its first attempt, and none was rescued.
    runs = [r[0] for r in read_records(record)]
    assert sorted(runs) == sorted(ids)
    assert counts(sqlite_url) == {"completed": len(ids), "dead": 0}
    attempts = sql(
        sqlite_url,
        "SELECT max(attempt), max(unstarted_returns), max(json_array_length(errors)) "
        "FROM jobkeeper_jobs",
    )
    assert tuple(attempts[0]) == (1, 0, 0)
    assert "rescued" not in logs

    # No heartbeat lapse anywhere near rescue_after: a hold (2 s) plus a beat
    # interval is the least possible; 2.6 s was measured (3.2 s when beats
    # polled for the lock at SQLite's 100 ms).
    for beats in heartbeat_log(sqlite_url).values():
        gap = max(b - a for a, b in itertools.pairwise(beats))
        assert gap < SETTINGS["rescue_after"] * 0.75, gap


def test_c13_lock_held_past_busy_timeout_fails_clearly_and_writes_nothing(sqlite_url):
    jq = JobQueue(sqlite_url, busy_timeout=0.3)
    jq.migrate()
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(DatabaseUnavailable, match=r"busy_timeout=0\.3s; nothing was written"):
            jq.enqueue_many([("record", {"record": "-", "n": n}) for n in range(10)])
        holder.execute("ROLLBACK")
        assert sql(sqlite_url, "SELECT count(*) FROM jobkeeper_jobs")[0][0] == 0
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        jq.close()
