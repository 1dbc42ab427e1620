"""A burst worker (and ``testing.drain``, which runs one) stops when what is
left cannot be claimed: a paused queue, a queue at its concurrency with the
slots held elsewhere, a serial key held elsewhere, a rate window that frees
no start within ``poll_interval``. It waited for ever before: the next-due
check answered 0 for any available job. A rate window that frees within
``poll_interval`` is waited for. Both backends.
"""

from __future__ import annotations

import sys
import time

import psycopg

from backends.helpers import claim
from e2e.helpers import processes, wait_exit
from jobkeeper import JobQueue, JobStatus
from jobkeeper.backends.postgres.queries import QUERIES
from jobkeeper.testing import drain
from support.db import sql

APP = "tests.flow.app:jq"


def due_in(jq: JobQueue, *queues: str) -> float | None:
    return jq.backend.job_next_due_in(queues=list(queues))


def test_next_due_in_leaves_out_what_cannot_be_claimed(jq):
    jq.enqueue("t", {}, queue="paused")
    assert due_in(jq, "paused") == 0
    jq.pause("paused")
    assert due_in(jq, "paused") is None
    jq.enqueue("t", {}, queue="open")
    assert due_in(jq, "paused", "open") == 0

    jq.configure_queue("one-at-a-time", concurrency=1)
    jq.enqueue("t", {}, queue="one-at-a-time")
    jq.enqueue("t", {}, queue="one-at-a-time")
    assert len(claim(jq, "one-at-a-time")) == 1
    assert due_in(jq, "one-at-a-time") is None

    jq.enqueue("t", {}, queue="keyed", serial_key="k")
    jq.enqueue("t", {}, queue="keyed", serial_key="k")
    assert len(claim(jq, "keyed")) == 1
    assert due_in(jq, "keyed") is None
    jq.enqueue("t", {}, queue="keyed")  # no key: claimable
    assert due_in(jq, "keyed") == 0

    jq.configure_queue("rated", rate_limit="2/m")
    for _ in range(3):
        jq.enqueue("t", {}, queue="rated")
    assert due_in(jq, "rated") == 0
    assert len(claim(jq, "rated")) == 2
    waiting = due_in(jq, "rated")
    assert waiting is not None and 55 < waiting <= 60

    # A scheduled job still counts, whatever its queue's state: it comes due.
    jq.enqueue("t", {}, queue="paused", delay=60)
    waiting = due_in(jq, "paused")
    assert waiting is not None and 55 < waiting <= 60
    jq.resume("paused")
    assert due_in(jq, "paused") == 0


def test_drain_returns_on_a_paused_or_rate_limited_queue(jq):
    ran: list[int] = []

    @jq.task(queue="held")
    def job(i: int) -> None:
        ran.append(i)

    for i in range(3):
        job.enqueue(i=i)
    jq.pause("held")
    assert drain(jq, queues=["held"]) == {}
    assert ran == []
    jq.resume("held")
    jq.configure_queue("held", rate_limit="1/h")
    assert drain(jq, queues=["held"]) == {"completed": 1}
    assert ran == [0]
    held = {status: n for status, n in jq.stats()["held"].items() if n}
    assert held == {"available": 2, "completed": 1}


def test_a_burst_worker_waits_for_a_rate_window_that_frees_within_poll_interval(make_queue):
    jq = make_queue(poll_interval=1.5)
    jq.configure_queue("fast", rate_limit="2/s")
    ran: list[float] = []

    @jq.task(queue="fast")
    def job() -> None:
        ran.append(time.monotonic())

    for _ in range(5):
        job.enqueue()
    jq.run_worker(queues=["fast"], burst=True)
    assert len(ran) == 5
    assert ran[-1] - ran[0] > 1.0  # three windows: the limit held


def test_a_burst_worker_process_stops_on_blocked_queues(db_url, tmp_path):
    with JobQueue(db_url) as jq:
        jq.migrate()
        record = str(tmp_path / "runs.txt")
        for queue in ("q", "q", "paused", "rated", "rated"):
            jq.enqueue("timed", {"seconds": 0, "record": record}, queue=queue, external=True)
        jq.pause("paused")
        jq.configure_queue("rated", rate_limit="1/h")
        argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker", "--app", APP]
        argv += ["--burst", "--queue", "q", "--queue", "paused", "--queue", "rated"]
        with processes(tmp_path) as procs:
            started = time.monotonic()
            worker = procs.spawn(argv, settings={"poll_interval": 0.2}, name="burst")
            assert wait_exit(worker, timeout=60) == 0
            took = time.monotonic() - started
        assert took < 30, f"the burst worker took {took:.0f}s to stop"
        counts = {
            (queue, status): n
            for queue, status, n in sql(
                db_url, "SELECT queue, status, count(*) FROM jobkeeper_jobs GROUP BY 1, 2"
            )
        }
        assert counts == {
            ("q", JobStatus.COMPLETED.value): 2,
            ("paused", JobStatus.AVAILABLE.value): 1,
            ("rated", JobStatus.COMPLETED.value): 1,
            ("rated", JobStatus.AVAILABLE.value): 1,
        }


def test_next_due_in_is_planned_below_the_jit_threshold(pg_url):
    """The check runs at every empty claim of a burst worker. As one EXISTS
    with the serial-key test in its filter it was planned as a sequential
    scan costed at 167,000 for 40,000 available jobs, over PostgreSQL's
    default ``jit_above_cost`` of 100,000: each burst worker's first empty
    claim spent about a second of server CPU compiling it (seen with
    auto_explain under benchmarks/processes.py).
    """
    jq = JobQueue(pg_url)
    try:
        jq.migrate()
        for _ in range(40):
            jq.enqueue_many([("t", {})] * 1000)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ANALYZE jobkeeper_jobs")
            threshold = float(conn.execute("SHOW jit_above_cost").fetchone()[0])
            plan = conn.execute(
                "EXPLAIN (FORMAT JSON) " + QUERIES["job_next_due_in"],
                {"queues": ["default"], "now": None},
            ).fetchone()[0]
        cost = plan[0]["Plan"]["Total Cost"]
        assert 0 < cost < min(threshold, 10_000), plan
        assert due_in(jq, "default") == 0
    finally:
        jq.close()
