"""C-14 (Betterment/delayed#109, graphile/worker#497): a worker whose
concurrency is at least its connection pool's size must still heartbeat,
start and complete jobs.

jobkeeper's pool (``pool_size``) serves API calls, which tasks make; the
worker's own work (claims, outcomes, heartbeat, maintenance, LISTEN) runs on
dedicated connections, so the configuration is allowed. Here the pool has 2
connections and the worker runs 10 jobs at once, each holding a pooled
connection for 0.5 s of server work (so the tasks queue on the pool, eight
waiting at any time) and then enqueuing a follow-up through the API. Every
job completes once, on its first attempt, with no pool timeout, no rescue and
no heartbeat gap near ``rescue_after``, and each outcome written as soon as
its task returned.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time

import pytest

from e2e.helpers import processes, read_records, wait_exit
from jobkeeper import JobQueue, JobStatus
from support.db import sql
from support.heartbeats import heartbeat_log, install_heartbeat_log
from support.settings import FAST
from support.waiting import wait_for, wait_status
from worker.helpers import running

pytestmark = pytest.mark.slow

#: Beats every 0.2 s, a rescue after 2 s of silence: a heartbeat that waited
#: its turn on the pool behind the tasks (4 x 0.5 s) would be rescued.
SETTINGS = {**FAST, "heartbeat_interval": 0.2, "rescue_after": 2.0, "pool_size": 2}
JOBS = 20
HOLD = 0.5


def test_c14_pool_smaller_than_concurrency_starves_no_bookkeeping(pg_url, tmp_path):
    jq = JobQueue(pg_url, **SETTINGS)
    try:
        jq.migrate()
        install_heartbeat_log(pg_url)
        record = tmp_path / "runs.log"
        ids = [
            j.id
            for j in jq.enqueue_many(
                [("pool_hold", {"seconds": HOLD, "record": str(record)})] * JOBS
            )
        ]
        with processes(tmp_path) as procs:
            worker = procs.worker(pg_url, SETTINGS, concurrency=10)
            done = wait_status(jq, ids, {JobStatus.COMPLETED, JobStatus.DEAD}, timeout=120)
            worker.send_signal(signal.SIGTERM)
            assert wait_exit(worker) == 0, procs.log(worker)
            log = procs.log(worker)
        for j in done:
            assert (j.status, j.attempt, j.errors, j.unstarted_returns) == (
                JobStatus.COMPLETED, 1, [], 0,
            ), j  # fmt: skip
        assert sorted(r[0] for r in read_records(record)) == sorted(ids)  # each ran once
        followups = sql(pg_url, "SELECT count(*) FROM jobkeeper_jobs WHERE queue = 'followups'")
        assert followups[0][0] == JOBS
        for word in ("rescued", "PoolTimeout", "unavailable", "Traceback"):
            assert word not in log, log
        # Each outcome was written at once, not after a turn on the pool (the
        # task returned its own end time; finished_at is the database's).
        late = max(j.finished_at.timestamp() - j.result for j in done if j.finished_at)
        assert late < SETTINGS["rescue_after"] / 2, late
        (beats,) = heartbeat_log(pg_url).values()
        gap = max(b - a for a, b in itertools.pairwise(beats))
        assert gap < SETTINGS["rescue_after"] / 2, gap
    finally:
        jq.close()


def test_c14_start_marks_need_no_pool_connection(pg_url, caplog):
    # Every pooled connection is held (the tasks' work, here the test's), and
    # a job that lost an earlier claim before it started must have its start
    # mark written before its task is called (see Claims.started). That
    # write waited its turn on the pool: POOL_TIMEOUT (10 s), then a warning.
    jq = JobQueue(pg_url, **{**FAST, "pool_size": 2})
    try:
        jq.migrate()
        j = jq.enqueue("noop", {})
        sql(pg_url, "UPDATE jobkeeper_jobs SET unstarted_returns = 1 WHERE id = ?", [j.id])

        @jq.task
        def noop() -> str:
            return "ran"

        source = jq.backend._source  # test hook: the API pool itself
        with contextlib.ExitStack() as hold:
            for _ in range(SETTINGS["pool_size"]):
                hold.enter_context(source.connection())
            began = time.monotonic()
            with running(jq.worker(concurrency=2)):
                wait_for(
                    lambda: (
                        sql(pg_url, "SELECT status FROM jobkeeper_jobs WHERE id = ?", [j.id])
                        == [("completed",)]
                    ),
                    timeout=30,
                    what="the job to complete",
                )
                took = time.monotonic() - began
        assert took < 5.0, f"the start waited on the pool for {took:.1f}s"
        assert "start mark not written" not in caplog.text
    finally:
        jq.close()


def test_c14_hold_confirmation_after_a_stale_spell_needs_no_pool_connection(pg_url):
    # A job claimed before a stale heartbeat spell starts only once the
    # database confirms we still hold it (Claims.may_start). With every pooled
    # connection held by task work, that read waited on the pool for ever
    # (POOL_TIMEOUT, then again): the job could not start.
    jq = JobQueue(pg_url, **{**FAST, "pool_size": 2, "rescue_after": 4.0})
    try:
        jq.migrate()
        release = threading.Event()

        @jq.task
        def first() -> str:
            release.wait(30)
            return "first"

        @jq.task
        def second() -> str:
            return "second"

        a = first.enqueue()
        b = second.enqueue()

        def status(job_id: int) -> str:
            return sql(pg_url, "SELECT status FROM jobkeeper_jobs WHERE id = ?", [job_id])[0][0]

        worker = jq.worker(concurrency=1, prefetch=1)
        with running(worker):
            wait_for(
                lambda: status(a.id) == "running" and status(b.id) == "claimed", what="b ready"
            )
            # A stale spell: the heartbeat silent past fresh_for (rescue_after / 2).
            worker.heartbeat.paused = True
            wait_for(lambda: worker.claims.beat_age() > 2.5, what="a stale heartbeat")
            worker.heartbeat.paused = False
            wait_for(lambda: worker.claims.fresh(), what="a fresh heartbeat again")
            source = jq.backend._source  # test hook: the API pool itself
            with contextlib.ExitStack() as hold:
                for _ in range(2):
                    hold.enter_context(source.connection())
                release.set()
                began = time.monotonic()
                wait_for(lambda: status(b.id) == "completed", timeout=30, what="b to complete")
                took = time.monotonic() - began
        assert took < 5.0, f"the start waited on the pool for {took:.1f}s"
    finally:
        jq.close()
