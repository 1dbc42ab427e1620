"""C-03 (procrastinate#1518): running jobs orphaned forever, (a) because the
dead worker's row was pruned before stalled-job detection ran, (b) because a
restarted worker re-registered under the dead run's identity (a container's
fixed host name, PID 1) and its heartbeats kept the dead run's jobs alive.

jobkeeper's rescue reads the job rows alone: a held job whose holder has no
fresh heartbeat *or no row at all* is a candidate. And a worker id is
``host:pid:random``, so a restart never heartbeats for the dead run. Both
scenarios run with real worker processes, SIGKILLed mid-job, on both
backends; the job is rescued within rescue_after plus one maintenance
interval, its lost attempt counted, and it runs again.
"""

from __future__ import annotations

import signal
import sys
import textwrap

import pytest

from e2e.helpers import APP, processes, wait_exit
from jobkeeper import JobStatus
from support.audit import install_job_audit, job_audit
from support.db import is_pg, sql
from support.settings import FAST
from support.waiting import wait_for

pytestmark = pytest.mark.slow

RESCUE_AFTER = FAST["rescue_after"]
#: How often every worker's rescuer runs at this rescue_after (the runner's
#: maintenance interval: rescue_after / 4).
MAINTENANCE = RESCUE_AFTER / 4
#: Room for process start-up and scheduling on a loaded 2-core machine.
SLACK = 1.5


def _epoch(url: str, column: str) -> str:
    return f"extract(epoch FROM {column})::float8" if is_pg(url) else column


def _worker_rows(url: str) -> dict[str, tuple[float, float]]:
    """worker id -> (started_at, heartbeat_at), Unix seconds (database clock)."""
    rows = sql(
        url,
        f"SELECT id, {_epoch(url, 'started_at')}, {_epoch(url, 'heartbeat_at')} "
        "FROM jobkeeper_workers",
    )
    return {str(wid): (float(started), float(beat)) for wid, started, beat in rows}


def _rescue_of(url: str, job_id: int) -> float:
    """When the job's lost attempt was rescued (database clock)."""
    changes = job_audit(url)[job_id]
    rescued = [c for c in changes if c.old_status == "running" and c.new_status == "retryable"]
    assert len(rescued) == 1, changes
    return rescued[0].at


def _completed_after_one_lost_attempt(jq, job_id: int, lost_holder: str):
    done = wait_for(
        lambda: (j := jq.get_job(job_id)).status == JobStatus.COMPLETED and j,
        what="the orphaned job to be rescued and run again",
    )
    assert done.attempt == 2, done
    assert [e["attempt"] for e in done.errors] == [1], done.errors
    assert "worker lost" in done.errors[0]["error"] and lost_holder in done.errors[0]["error"]
    return done


def test_c03a_job_of_a_pruned_worker_row_is_still_rescued(make_queue, tmp_path):
    jq = make_queue()
    url = jq.url.url
    install_job_audit(url)
    # Attempt 1 sleeps 60 s (in one C call); attempt 2 returns at once.
    job = jq.enqueue("stuck_once", {"seconds": 60.0})
    with processes(tmp_path) as procs:
        a = procs.worker(url, FAST, concurrency=1)
        held = wait_for(
            lambda: (j := jq.get_job(job.id)).status == JobStatus.RUNNING and j,
            what="A to run the job",
        )
        a.send_signal(signal.SIGKILL)
        assert wait_exit(a) == -signal.SIGKILL
        # Dead-worker pruning runs first: A's row goes (jobkeeper's own prune
        # operation, once A has been silent for twice its rescue_after).
        wait_for(
            lambda: jq.backend.worker_prune_stale(older_than=0) >= 1,
            what="A's worker row to be pruned",
        )
        assert held.worker_id not in _worker_rows(url)
        still = jq.get_job(job.id)
        assert (still.status, still.worker_id) == (JobStatus.RUNNING, held.worker_id)

        b = procs.worker(url, FAST, concurrency=1)
        done = _completed_after_one_lost_attempt(jq, job.id, held.worker_id)
        assert b.poll() is None
        (b_id,) = _worker_rows(url)
        b_started, _ = _worker_rows(url)[b_id]
    # B's rescuer took it at once: nothing to wait for once the row is gone.
    assert _rescue_of(url, job.id) - b_started <= RESCUE_AFTER + MAINTENANCE + SLACK
    assert done.result is not None and done.result == 2


#: A worker in a "container": the same host name and PID 1 on every start.
CONTAINER = textwrap.dedent(
    """
    import os, runpy, socket, sys
    os.getpid = lambda: 1
    socket.gethostname = lambda: "pod-0"
    sys.argv = ["jobkeeper", "--database", sys.argv[1], "worker", "--app", sys.argv[2],
                "--concurrency", "1"]
    runpy.run_module("jobkeeper", run_name="__main__")
    """
)


def test_c03b_restart_with_the_same_host_and_pid_does_not_keep_the_dead_runs_jobs(
    make_queue, tmp_path
):
    jq = make_queue()
    url = jq.url.url
    install_job_audit(url)
    job = jq.enqueue("stuck_once", {"seconds": 60.0})
    with processes(tmp_path) as procs:
        a = procs.spawn([sys.executable, "-c", CONTAINER, url, APP], settings=FAST, name="pod")
        held = wait_for(
            lambda: (j := jq.get_job(job.id)).status == JobStatus.RUNNING and j,
            what="the first run to hold the job",
        )
        assert held.worker_id.startswith("pod-0:1:")
        a.send_signal(signal.SIGKILL)
        assert wait_exit(a) == -signal.SIGKILL
        b = procs.spawn([sys.executable, "-c", CONTAINER, url, APP], settings=FAST, name="pod")
        rows = wait_for(lambda: len(w := _worker_rows(url)) == 2 and w, what="the restart's row")
        (b_id,) = set(rows) - {held.worker_id}
        # Same host and pid, a new identity: the dead run's row is left silent.
        assert b_id.startswith("pod-0:1:") and b_id != held.worker_id
        done = _completed_after_one_lost_attempt(jq, job.id, held.worker_id)
        assert b.poll() is None
        rows = _worker_rows(url)
    a_last_beat = rows[held.worker_id][1]
    b_started = rows[b_id][0]
    # Never before the dead run had been silent for rescue_after; then within
    # rescue_after and one maintenance interval of its last beat, or of the
    # restart's start if later (a worker whose first beat came late judges
    # nobody for a window).
    rescued_at = _rescue_of(url, job.id)
    assert rescued_at - a_last_beat >= RESCUE_AFTER
    assert rescued_at - max(a_last_beat, b_started) <= RESCUE_AFTER + MAINTENANCE + SLACK
    claims = [c for c in job_audit(url)[job.id] if c.new_status == "claimed"]
    assert [(c.attempt, c.worker_id) for c in claims] == [(1, held.worker_id), (2, b_id)]
    assert done.result == 2
