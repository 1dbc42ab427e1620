"""C-02 (river#1302): the rescuer's stale snapshot overwrites a job that has
just completed (or a fresh claim of it).

jobkeeper's rescuer reads its candidates, then writes each rescue fenced on
the ``(id, worker_id, attempt, fence)`` it read, on the job still being held
(``claimed``/``running``) and on the holder still being silent. A completion
clears ``worker_id`` and a new claim moves ``fence``, so a rescue written
after either changes 0 rows.

Heartbeats are suspended through the database: a trigger drops the heartbeat
writes of the workers listed in ``test_silenced`` (``*``: all of them), as if
the worker's beats never reached the table (pgqueuer#430's buffer). In the
load variant a claim and a start mark still stamp the holder's heartbeat, so
each job's rescue horizon is rescue_after after its own start and the jobs,
lasting 0.8-1.2 x rescue_after, finish right at it. Every change of a job row
is recorded by an audit trigger.
"""

from __future__ import annotations

import json
import random
import sys
import textwrap
import threading
from typing import Any

import pytest

from e2e.helpers import processes
from jobkeeper import JobQueue, JobStatus
from jobkeeper.maintenance.rescuer import Rescuer
from support.audit import install_job_audit, job_audit
from support.db import is_pg, sql
from support.settings import FAST
from support.waiting import DEADLINE, wait_for

pytestmark = pytest.mark.slow

#: Worker processes with the case's tasks. Argument 3 "judge" keeps the
#: worker's own rescuer; "mute" turns it off, so that the test's paused
#: rescuer is the only one to judge the worker's jobs.
WORKER = textwrap.dedent(
    """
    import json, random, sys, time
    from jobkeeper import JobQueue, current_job
    url, settings, judge = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "judge"
    jq = JobQueue(url, **settings)

    @jq.task(max_attempts=100)
    def jittered(low: float, high: float) -> int:
        time.sleep(random.uniform(low, high))
        return current_job().attempt

    @jq.task(max_attempts=5)
    def nap(seconds: float, later: float | None = None) -> int:
        attempt = current_job().attempt
        time.sleep(seconds if attempt == 1 or later is None else later)
        return attempt

    worker = jq.worker(concurrency=1, prefetch=0)
    if not judge:
        worker.rescuer.run_once = lambda: None
    worker.run()
    """
)


def _install_heartbeat_gate(url: str, *, stamp_on_claim: bool) -> None:
    """Drop the heartbeat writes of the workers in ``test_silenced``; with
    ``stamp_on_claim``, a job's claim and start mark still stamp its holder's
    heartbeat (let through by ``test_beat_pass``, inside the same write).
    """
    sql(url, "CREATE TABLE test_silenced (worker_id text)")
    sql(url, "CREATE TABLE test_beat_pass (worker_id text)")
    silenced = (
        "EXISTS (SELECT 1 FROM test_silenced WHERE worker_id IN ({id}, '*')) "
        "AND NOT EXISTS (SELECT 1 FROM test_beat_pass WHERE worker_id = {id})"
    )
    stamp = (
        "INSERT INTO test_beat_pass VALUES (NEW.worker_id); "
        "UPDATE jobkeeper_workers SET heartbeat_at = {now} WHERE id = NEW.worker_id; "
        "DELETE FROM test_beat_pass WHERE worker_id = NEW.worker_id;"
    )
    if is_pg(url):
        sql(
            url,
            f"""
            CREATE FUNCTION test_heartbeat_gate() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF {silenced.format(id="OLD.id")} THEN RETURN NULL; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_heartbeat_gate BEFORE UPDATE OF heartbeat_at
                ON jobkeeper_workers FOR EACH ROW EXECUTE FUNCTION test_heartbeat_gate();
            CREATE FUNCTION test_stamp_on_claim() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN {stamp.format(now="now()")} RETURN NEW; END $$;
            """,
        )
        if stamp_on_claim:
            sql(
                url,
                "CREATE TRIGGER test_stamp_on_claim AFTER UPDATE OF status ON jobkeeper_jobs "
                "FOR EACH ROW WHEN (NEW.status IN ('claimed', 'running') "
                "AND OLD.status <> NEW.status) EXECUTE FUNCTION test_stamp_on_claim()",
            )
        return
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    sql(
        url,
        "CREATE TRIGGER test_heartbeat_gate BEFORE UPDATE OF heartbeat_at ON jobkeeper_workers "
        f"WHEN {silenced.format(id='OLD.id')} BEGIN SELECT RAISE(IGNORE); END",
    )
    if stamp_on_claim:
        sql(
            url,
            "CREATE TRIGGER test_stamp_on_claim AFTER UPDATE OF status ON jobkeeper_jobs "
            "WHEN NEW.status IN ('claimed', 'running') AND OLD.status <> NEW.status "
            f"BEGIN {stamp.format(now=now)} END",
        )


def _silence(url: str, worker_id: str) -> None:
    sql(url, "INSERT INTO test_silenced VALUES (?)", [worker_id])


class RescueWrites:
    """The test rescuer's backend: runs ``before`` between the rescuer's
    select and its write, and keeps what each write was asked and did."""

    def __init__(self, backend: Any, before: Any) -> None:
        self._backend = backend
        self._before = before
        self.asked: list[int] = []
        self.written: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def job_fail_many(self, *, failures: Any, stale_after: Any = None) -> set[int]:
        self._before(failures)
        written = self._backend.job_fail_many(failures=failures, stale_after=stale_after)
        self.asked += [f.claim.job_id for f in failures]
        self.written += sorted(written)
        return written


def _spawn(procs: Any, url: str, settings: dict[str, Any], mode: str) -> Any:
    argv = [sys.executable, "-c", WORKER, url, json.dumps(settings), mode]
    return procs.spawn(argv, settings={}, name="worker")


def _changes_after_completion(url: str) -> list[Any]:
    out = []
    for changes in job_audit(url).values():
        done = [c.seq for c in changes if c.new_status == "completed"]
        if done:
            out += [c for c in changes if c.seq > done[0]]
    return out


def _paused_rescue(url: str, jq: Any, job_id: int, while_paused: Any) -> RescueWrites:
    """Run a rescuer until it selects ``job_id``; between that select and its
    write, run ``while_paused`` (with what the rescuer saw); then let it write.
    """
    seen = threading.Event()

    def before(failures: Any) -> None:
        mine = [f for f in failures if f.claim.job_id == job_id]
        if mine and not seen.is_set():
            seen.set()
            while_paused(mine[0].claim)

    writes = RescueWrites(jq.backend, before)
    rescuer = Rescuer(writes, jq.settings, 0.1)
    wait_for(lambda: rescuer.run_once() or seen.is_set(), what="the rescuer to select the job")
    return writes


def test_c02_rescue_paused_past_a_completion_writes_nothing(make_queue, tmp_path):
    jq = make_queue()
    url = jq.url.url
    install_job_audit(url)
    _install_heartbeat_gate(url, stamp_on_claim=False)
    window = jq.settings.rescue_after
    # Selected once W has been silent for a window; done three windows later.
    job = jq.enqueue("nap", {"seconds": 4 * window})
    with processes(tmp_path) as procs:
        w = _spawn(procs, url, FAST, "mute")
        held = wait_for(
            lambda: (j := jq.get_job(job.id)).status == JobStatus.RUNNING and j, what="W runs"
        )
        _silence(url, held.worker_id)

        def complete_meanwhile(claim: Any) -> None:
            assert (claim.worker_id, claim.attempt) == (held.worker_id, 1)
            assert jq.get_job(job.id).status == JobStatus.RUNNING  # what it saw: still running
            wait_for(lambda: jq.get_job(job.id).status == JobStatus.COMPLETED, what="W's ack")

        writes = _paused_rescue(url, jq, job.id, complete_meanwhile)
        assert w.poll() is None
    assert writes.asked == [job.id] and writes.written == []
    done = jq.get_job(job.id)
    assert (done.status, done.attempt, done.errors, done.result) == (JobStatus.COMPLETED, 1, [], 1)
    assert _changes_after_completion(url) == []


def test_c02_rescue_paused_past_a_new_claim_writes_nothing(make_queue, tmp_path):
    jq = make_queue()
    url = jq.url.url
    install_job_audit(url)
    _install_heartbeat_gate(url, stamp_on_claim=False)
    window = jq.settings.rescue_after
    # W1's attempt outlasts W2's start and rescue by far; W2's attempt outlasts
    # the paused write.
    job = jq.enqueue("nap", {"seconds": 10 * window, "later": 3 * window})
    with processes(tmp_path) as procs:
        w1 = _spawn(procs, url, FAST, "mute")
        held = wait_for(
            lambda: (j := jq.get_job(job.id)).status == JobStatus.RUNNING and j, what="W1 runs"
        )
        _silence(url, held.worker_id)

        def reclaimed_meanwhile(claim: Any) -> None:
            assert (claim.worker_id, claim.attempt, claim.fence) == (held.worker_id, 1, 1)
            # Another worker's rescuer takes the job, and that worker claims
            # attempt 2 of it.
            _spawn(procs, url, FAST, "judge")
            wait_for(
                lambda: (
                    (j := jq.get_job(job.id)).status == JobStatus.RUNNING
                    and j.worker_id != held.worker_id
                ),
                what="W2 to run attempt 2",
            )

        writes = _paused_rescue(url, jq, job.id, reclaimed_meanwhile)
        assert writes.asked == [job.id] and writes.written == []
        now = jq.get_job(job.id)
        assert (now.status, now.attempt, now.fence) == (JobStatus.RUNNING, 2, 2), now
        assert len(now.errors) == 1 and now.errors[0]["attempt"] == 1
        done = wait_for(
            lambda: (j := jq.get_job(job.id)).status == JobStatus.COMPLETED and j,
            what="W2 to complete attempt 2",
        )
        assert w1.poll() is None
    # (W1's attempt 1 is still asleep: if it returns, the fence refuses its ack.)
    assert (done.attempt, done.result, len(done.errors)) == (2, 2, 1)
    assert _changes_after_completion(url) == []


def test_c02_jobs_finishing_at_the_rescue_horizon_never_leave_completed(db_url, tmp_path):
    # Scaled from the case's 2,000 jobs of 0.8-1.2 s, 1 s window, rescue passes
    # every 100 ms: 80 jobs, a 0.3 s window, a pass every 30 ms.
    # Every job here is rescued from a silent but live holder, again and
    # again: the crash budget (a rescue of a lone attempt counts as a crash)
    # would dead-letter them; this case is about the rescue's write alone.
    settings = {**FAST, "heartbeat_interval": 0.1, "rescue_after": 0.3, "max_crashes": 1_000_000}
    jq = JobQueue(db_url, **settings)
    try:
        jq.migrate()
        url = jq.url.url
        install_job_audit(url)
        _install_heartbeat_gate(url, stamp_on_claim=True)
        _silence(url, "*")
        window = settings["rescue_after"]
        ids = [
            j.id
            for j in jq.enqueue_many(
                [("jittered", {"low": 0.8 * window, "high": 1.2 * window})] * 80
            )
        ]
        stop = threading.Event()

        def widen(failures: Any) -> None:
            # The gap between select and write, widened to 10% of the window.
            stop.wait(random.uniform(0, 0.1 * window))

        writes = RescueWrites(jq.backend, widen)
        rescuer = Rescuer(writes, jq.settings, 0.1 * window)
        with processes(tmp_path) as procs:
            workers = [_spawn(procs, url, settings, "judge") for _ in range(4)]
            rescuer.start()
            try:
                wait_for(
                    lambda: all(jq.get_job(i).status == JobStatus.COMPLETED for i in ids),
                    timeout=2 * DEADLINE,
                    what="every job to complete",
                    every=0.2,
                )
            finally:
                stop.set()
                rescuer.stop()
            assert all(proc.poll() is None for proc in workers)
        # A completed job never left completed, and no rescue reached one.
        assert _changes_after_completion(url) == []
        for job_id in ids:
            done = jq.get_job(job_id)
            # Rescue entries belong to earlier attempts, one each. (A worker
            # may also hand a claim back unstarted, with a note and its
            # attempt number given back, when its own beat came late.)
            lost = [e["attempt"] for e in done.errors if "worker lost" in e["error"]]
            assert lost == sorted(set(lost)) and all(a < done.attempt for a in lost), done
            assert done.result == done.attempt
        # The races happened: live jobs were rescued at the horizon, and
        # rescues that came after their job moved on changed nothing.
        history = job_audit(url)
        rescued = [
            c
            for cs in history.values()
            for c in cs
            if c.old_status == "running" and c.worker_id is None and c.new_status == "retryable"
        ]
        assert rescued
        assert len(writes.written) < len(writes.asked), (writes.asked, writes.written)
    finally:
        jq.close()
