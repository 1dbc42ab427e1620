"""Long jobs are not stolen from live workers.

A CPU-bound sync task, and async tasks that block the event loop (a blocking
sleep; a CPU-bound loop), each running several times ``rescue_after`` on a
live worker process, keep their claims: heartbeats run on their own thread and
connection, so they never wait for a task to yield. Each job runs exactly
once, nothing is rescued, and every worker's heartbeat (recorded by a trigger)
never pauses for a whole rescue window (a heartbeat that waited for a task
would pause for the task's length, several windows). A job held by a worker that does
not exist is rescued meanwhile, proving the rescuers were at work.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmarks.soak import instrument
from benchmarks.soak.history import read_exec_logs

from jobkeeper import JobQueue
from support.settings import SOAK, soak_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RESCUE_AFTER = SOAK["rescue_after"]
RUN_FOR = 3.5 * RESCUE_AFTER  # seconds each long job runs


def start_worker(url: str, log_dir: Path, index: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBKEEPER_DATABASE_URL": url,
        "SOAK_LOG_DIR": str(log_dir),
        **soak_env(SOAK),
    }
    command = [sys.executable, "-m", "jobkeeper", "--database", url, "worker"]
    command += ["--app", "benchmarks.soak.app:jq", "--concurrency", "2", "--queue", "long"]
    with (log_dir / f"worker-{index}.log").open("wb") as stderr:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )


def test_long_jobs_keep_their_claims_on_live_workers(db_url, tmp_path):
    jq = JobQueue(db_url, **SOAK)
    jq.migrate()
    instrument.install(db_url)
    long = {"queue": "long"}
    jobs = jq.enqueue_many(
        [
            ("soak.long_cpu", {"n": 1, "seconds": RUN_FOR}, long),
            ("soak.long_cpu", {"n": 2, "seconds": RUN_FOR}, long),
            ("soak.long_async_block", {"n": 3, "seconds": RUN_FOR}, long),
            ("soak.long_async_block", {"n": 4, "seconds": RUN_FOR, "cpu": True}, long),
        ]
    )
    # The control: a running job whose holder never existed must be rescued.
    ghost = jq.enqueue("soak.noop", {"n": 5}, queue="ghost")
    assert jq.backend.job_claim(worker_id="ghost:1:dead", queue="ghost", limit=1)
    workers = [start_worker(db_url, tmp_path, i) for i in range(2)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = [jq.get_job(j.id) for j in jobs]
            if all(j is not None and j.status.value == "completed" for j in done):
                break
            assert all(w.poll() is None for w in workers), "a worker exited"
            time.sleep(0.1)
    finally:
        for worker in workers:
            worker.terminate()
        codes = [worker.wait(30) for worker in workers]
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("worker-*.log")))
    assert codes == [0, 0], logs
    for job in jobs:
        final = jq.get_job(job.id)
        assert final is not None
        assert final.status.value == "completed", (final, logs)
        assert final.attempt == 1, final.errors
        assert final.errors == []
        assert final.result["attempt"] == 1
    # Each ran exactly once, and the runs did overlap each other (2 workers x 2).
    events, bad = read_exec_logs(tmp_path)
    starts = [e for e in events if e.kind == "S"]
    assert bad == 0
    assert sorted(e.job for e in starts) == sorted(j.id for j in jobs)
    assert len({e.worker for e in starts}) == 2
    rescues = [line for line in logs.splitlines() if "rescued" in line]
    assert all(line.endswith(f"jobs of lost workers: [{ghost.id}]") for line in rescues), logs
    # The control job was rescued, so the rescuers were running all along. It
    # was only claimed (never started), so it came back without spending its
    # attempt, and with no errors entry (errors holds failed attempts only).
    rescued = jq.get_job(ghost.id)
    assert rescued is not None
    assert (rescued.status.value, rescued.attempt, rescued.unstarted_returns) == (
        "available",
        0,
        1,
    ), rescued
    # No gap in the heartbeats reached the rescue window while the jobs ran.
    # Every heartbeat_interval is the aim; on two loaded cores the scheduler
    # can delay one beat by a few intervals, which is no danger to the
    # claims: only a silence of rescue_after is.
    _, heartbeats, _ = instrument.read_state(db_url)
    for worker in {e.worker for e in starts}:
        own = [e.t for e in events if e.worker == worker]
        busy = (min(own), max(own))  # from its first start to its last end
        beats = sorted(t for t in heartbeats[worker] if busy[0] - 1 <= t <= busy[1] + 1)
        assert beats[0] <= busy[0] and beats[-1] >= busy[1] - RESCUE_AFTER / 2, (busy, beats)
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        assert max(gaps) < RESCUE_AFTER, (worker, max(gaps), gaps)
