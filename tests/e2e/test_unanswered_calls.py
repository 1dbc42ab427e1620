"""A database that accepts and never answers (break-test 121): a forwarder
between jobkeeper and PostgreSQL stops forwarding while it keeps every
socket open, as a stopped server process or a stuck proxy would. TCP
keepalives see nothing wrong (the forwarder's kernel acknowledges): the
stuck-call watchdog must find such calls, cut those the server is not
running, and leave alone those it is (a lock wait).

PostgreSQL only: SQLite has no network for a call to be stuck on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import threading
import time
from collections import Counter

import psycopg
import pytest

from jobkeeper import JobQueue, JobStatus, waiting
from jobkeeper.backends.postgres.backend import PostgresBackend
from jobkeeper.database_url import DatabaseURL
from jobkeeper.errors import DatabaseUnavailable
from support.blackhole import Blackhole
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for, wait_status
from worker.helpers import running

from .helpers import holder_pid, processes, read_records, wait_exit

pytestmark = pytest.mark.slow

#: rescue_after 8 s: a worker connection's call is checked on after 2 s
#: (a quarter of it), far from the rescue of its jobs.
SILENT = {**FAST, "heartbeat_interval": 0.2, "rescue_after": 8.0, "shutdown_grace": 1.0}


def test_a_worker_behind_connections_that_never_answer_recovers_on_new_ones(pg_url, tmp_path):
    # Every connection the worker has open stops being forwarded; new ones
    # are. Before the watchdog every thread of the worker waited in its call
    # until the forwarder healed (4.5 min in break-test 121), here never.
    jq = JobQueue(pg_url, **SILENT)
    jq.migrate()
    record = tmp_path / "runs.log"
    args = {"seconds": 0.05, "record": str(record)}
    with Blackhole(pg_url) as hole, processes(tmp_path) as procs:
        worker = procs.worker(hole.url(pg_url), SILENT, concurrency=2)
        first = [j.id for j in jq.enqueue_many([("naps", args)] * 4)]
        wait_for(
            lambda: all(jq.get_job(i).status == JobStatus.COMPLETED for i in first),
            what="the first jobs to complete",
        )
        long_one = jq.enqueue("naps", {"seconds": 3.0, "record": str(record)})
        wait_for(lambda: holder_pid(pg_url, long_one.id) == worker.pid, what="the long job held")
        hole.stop_old()
        later = [j.id for j in jq.enqueue_many([("naps", args)] * 4)]
        ids = [*first, long_one.id, *later]
        wait_for(
            lambda: all(jq.get_job(i).status == JobStatus.COMPLETED for i in ids),
            what="every job completed without the forwarder healing",
        )
        log = procs.log(worker)
        assert "cutting the connection" in log, log
        assert worker.poll() is None, log
    ends = Counter(r[0] for r in read_records(record) if r[3] == "end")
    assert ends == dict.fromkeys(ids, 1), ends  # each ran once: none was rescued or rerun
    assert all(jq.get_job(i).attempt == 1 for i in ids)
    jq.close()


@pytest.mark.parametrize("signals", [1, 2], ids=["SIGTERM", "SIGTERM-twice"])
def test_sigterm_ends_a_worker_whose_database_never_answers(pg_url, tmp_path, signals):
    # Nothing reaches the server any more, not even new connections. The
    # stop cannot hand the running job back nor deregister: the worker exits
    # 1 by shutdown_grace + 2 s + 10 s after the signal (EXIT_AFTER), says
    # so, and leaves the job to be rescued. Before, it never exited.
    jq = JobQueue(pg_url, **SILENT)
    jq.migrate()
    record = tmp_path / "runs.log"
    job = jq.enqueue("naps", {"seconds": 120.0, "record": str(record)})
    with Blackhole(pg_url) as hole, processes(tmp_path) as procs:
        worker = procs.worker(hole.url(pg_url), SILENT, concurrency=1)
        wait_for(lambda: read_records(record), what="the job to start")
        # Its start mark is batched: written before the silence, or the job
        # is left claimed rather than running.
        wait_for(lambda: jq.get_job(job.id).status == JobStatus.RUNNING, what="the start mark")
        hole.stop_all()
        worker.send_signal(signal.SIGTERM)
        if signals == 2:
            wait_for(lambda: "stopping" in procs.log(worker), what="the first signal seen")
            worker.send_signal(signal.SIGTERM)
        # The bound is 13 s (grace 1 s); this deadline only bounds a hang.
        assert wait_exit(worker, timeout=45) == 1, procs.log(worker)
        log = procs.log(worker)
        # Mostly the bound ends it; a stop whose calls were all cut (and its
        # connects timed out) in time may end on its own, leaving the job held.
        assert (
            "exiting now with code 1" in log and "rescued 8s after its last heartbeat" in log
        ) or "1 left held" in log, log
    held = jq.get_job(job.id)
    assert held.status == JobStatus.RUNNING and held.attempt == 1, held
    jq.close()


def _in_thread(call):
    """Run ``call`` on a daemon thread; returns (thread, outcome list)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("idle", [False, True], ids=["just-used", "pinged"])
def test_an_enqueue_on_a_pooled_connection_that_never_answers_ends(pg_url, idle):
    # A pooled connection used a moment ago is lent without a ping, and its
    # INSERT goes unanswered; one idle for over a second is pinged first,
    # and the ping goes unanswered (141.8 s in break-test 121). Either way
    # the call ends: with DatabaseUnavailable, not after the outage.
    JobQueue(pg_url).migrate()
    with Blackhole(pg_url) as hole:
        jq = JobQueue(hole.url(pg_url), **FAST)
        jq.enqueue("warm", {})
        if idle:
            threading.Event().wait(1.2)  # past IDLE_CHECK_AFTER: the checkout pings
        hole.stop_all()
        thread, outcome = _in_thread(lambda: jq.enqueue("t", {}))
        # Well past the bound (about 10 + 5 s for a call, 2 + 5 + 5 s for
        # a ping); without the watchdog it waits for as long as the outage.
        thread.join(60)
        assert not thread.is_alive(), "the enqueue still waits on the silent connection"
        assert isinstance(outcome[0], DatabaseUnavailable), outcome
        hole.heal()
        jq.close()


def test_a_pinged_connection_that_never_answers_gives_way_to_a_new_one(pg_url):
    # Only the pool's open connections are silent: the enqueue succeeds on a
    # new one once the ping was cut.
    JobQueue(pg_url).migrate()
    with Blackhole(pg_url) as hole:
        jq = JobQueue(hole.url(pg_url), **FAST)
        jq.enqueue("warm", {})
        threading.Event().wait(1.2)
        hole.stop_old()
        thread, outcome = _in_thread(lambda: jq.enqueue("t", {}))
        thread.join(60)
        assert not thread.is_alive(), "the enqueue still waits on the silent connection"
        assert not isinstance(outcome[0], Exception), outcome
        assert JobQueue(pg_url).get_job(outcome[0].id) is not None
        jq.close()


def test_a_statement_waiting_on_a_lock_is_not_cut(pg_url, caplog):
    # Another session holds the jobs table locked for three thresholds: the
    # server is running the statement (waiting on the lock), so the watchdog
    # warns and leaves it; it completes once the lock is released.
    JobQueue(pg_url).migrate()
    backend = PostgresBackend(DatabaseURL("postgresql", pg_url), dedicated=True, stuck_after=1.0)
    holder = psycopg.connect(pg_url, autocommit=True)
    caplog.set_level(logging.WARNING, logger="jobkeeper.postgres")
    try:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE jobkeeper_jobs")
        thread, outcome = _in_thread(
            lambda: backend._fetch_raw("SELECT count(*) FROM jobkeeper_jobs")
        )
        wait_for(
            lambda: "the server is still running it" in caplog.text,
            what="the watchdog to look at the waiting statement",
        )
        threading.Event().wait(2.0)  # two more looks
        holder.execute("COMMIT")
        thread.join(30)
        assert outcome == [[(0,)]], outcome
        assert "waiting on relation" in caplog.text, caplog.text
        assert "cutting" not in caplog.text, caplog.text
    finally:
        holder.close()
        backend.close()


def _silent_async_call(hole: Blackhole, jq: JobQueue, *, idle: bool, stop=None):
    """In a fresh event loop: a warm-up enqueue_async, then ``stop`` (the
    forwarder's) and one more. Returns (its outcome, the longest gap between
    ticks of a task that ticks every 0.1 s meanwhile: the loop's stalls).
    """

    async def main() -> tuple[object, float]:
        await jq.enqueue_async("warm", {})
        if idle:
            await asyncio.sleep(1.2)  # past IDLE_CHECK_AFTER: the checkout pings
        (stop or hole.stop_all)()
        ticks = [time.monotonic()]

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.1)
                ticks.append(time.monotonic())

        ticker = asyncio.create_task(tick())
        try:
            outcome: object = await jq.enqueue_async("t", {})
        except Exception as exc:
            outcome = exc
        ticker.cancel()
        ticks.append(time.monotonic())
        hole.heal()  # the loop's end closes the pool through the forwarder
        await jq.aclose()
        return outcome, max(b - a for a, b in itertools.pairwise(ticks))

    return _in_thread(lambda: asyncio.run(main()))


@pytest.mark.parametrize("idle", [False, True], ids=["just-used", "pinged"])
def test_an_enqueue_async_on_a_connection_that_never_answers_ends(pg_url, idle):
    # The loop's pool: the spare used a moment ago is lent without a ping
    # and its INSERT goes unanswered; one idle for over a second is pinged
    # and the ping goes unanswered. Either way the await ends with
    # DatabaseUnavailable (about 10 + 5 s, or 2 + 5 + 5 s), and the loop
    # runs meanwhile. Before, it waited for as long as the silence lasted.
    JobQueue(pg_url).migrate()
    with Blackhole(pg_url) as hole:
        jq = JobQueue(hole.url(pg_url), **FAST)
        thread, outcome = _silent_async_call(hole, jq, idle=idle)
        thread.join(60)
        assert not thread.is_alive(), "the enqueue_async still waits on the silent connection"
        error, stall = outcome[0]
        assert isinstance(error, DatabaseUnavailable), error
        if not idle:
            assert "jobkeeper cut the connection: no answer for" in str(error), error
        assert stall < 1.0, f"the event loop stalled {stall:.1f} s"
        jq.close()


def test_a_pinged_async_connection_that_never_answers_gives_way_to_a_new_one(pg_url):
    JobQueue(pg_url).migrate()
    with Blackhole(pg_url) as hole:
        jq = JobQueue(hole.url(pg_url), **FAST)
        thread, outcome = _silent_async_call(hole, jq, idle=True, stop=hole.stop_old)
        thread.join(60)
        assert not thread.is_alive(), "the enqueue_async still waits on the silent connection"
        job, stall = outcome[0]
        assert not isinstance(job, Exception), job
        assert JobQueue(pg_url).get_job(job.id) is not None
        assert stall < 1.0, f"the event loop stalled {stall:.1f} s"
        jq.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_wait_whose_listen_connection_stops_answering_still_ends(pg_url, monkeypatch, flavour):
    # The wait's LISTEN connection (and the API pool's) stop being
    # forwarded once the wait listens; the job then ends. Its NOTIFY never
    # reaches the waiter: the watchdog must find the silent LISTEN
    # connection (its ping goes unanswered) and the watch listen again,
    # which wakes the waiter to re-read. The 30 s re-read is put out of
    # reach: without the ping the wait runs into its timeout.
    monkeypatch.setattr(waiting, "RECHECK", 600.0)
    direct = JobQueue(pg_url, **FAST)
    direct.migrate()
    gate = threading.Event()

    @direct.task()
    def gated() -> int:
        gate.wait(60)
        return 7

    job = gated.enqueue()
    with Blackhole(pg_url) as hole, running(direct.worker(concurrency=1)):
        jq = JobQueue(hole.url(pg_url), **FAST)
        wait_status(direct, [job.id], {JobStatus.RUNNING})
        if flavour == "sync":
            thread, outcome = _in_thread(lambda: jq.wait(job.id, timeout=45))
        else:
            thread, outcome = _in_thread(lambda: asyncio.run(jq.wait_async(job.id, timeout=45)))
        watch = jq.backend.completion_watch()
        wait_for(lambda: watch.ready, what="the wait's LISTEN")
        wait_for(
            lambda: sql(pg_url, "SELECT awaited FROM jobkeeper_jobs WHERE id = ?", [job.id])[0][0],
            what="the job marked awaited",
        )
        threading.Event().wait(0.5)  # its read done: the waiter sleeps until woken
        hole.stop_old()
        started = time.monotonic()
        gate.set()
        thread.join(50)
        assert not thread.is_alive(), "the wait was never woken"
        assert outcome == [7], outcome
        # Ping (5 s) + threshold (2 s) + probe, then the re-read (its pooled
        # connection is silent too: a ping cut after 2 s).
        assert time.monotonic() - started < 30
        jq.close()
    direct.close()


def test_a_stop_checks_on_unanswered_calls_sooner_and_ends_without_the_bound(pg_url, tmp_path):
    # A worker whose calls are checked on after 10 s (a quarter of
    # rescue_after=40), stopped with shutdown_grace=1: the bound ends the
    # stop 13 s after the signal. Its open connections stop answering (new
    # ones are forwarded: a wedged proxy flow, stopped server processes),
    # then SIGTERM. Before, each stuck call the stop met (the claim, the
    # lease's resign, the hand-back) took 10 s to be looked at, and the
    # bound ended the process with code 1. Once the stop begins they are
    # looked at after 1 s: cut, done again on new connections, and the job
    # handed back, by the normal path.
    settings = {**SILENT, "rescue_after": 40.0}
    jq = JobQueue(pg_url, **settings)
    jq.migrate()
    record = tmp_path / "runs.log"
    job = jq.enqueue("naps", {"seconds": 120.0, "record": str(record)})
    with Blackhole(pg_url) as hole, processes(tmp_path) as procs:
        worker = procs.worker(hole.url(pg_url), settings, concurrency=1)
        wait_for(lambda: read_records(record), what="the job to start")
        wait_for(lambda: jq.get_job(job.id).status == JobStatus.RUNNING, what="the start mark")
        hole.stop_old()
        worker.send_signal(signal.SIGTERM)
        code = wait_exit(worker, timeout=45)
        log = procs.log(worker)
        assert "exiting now with code 1" not in log, log
        assert "cutting the connection" in log, log
        assert code == 0, log
        assert "1 handed back, 0 left held" in log, log
    back = jq.get_job(job.id)
    assert back.status != JobStatus.RUNNING and back.worker_id is None, back
    # Its deregister, cut on a silent connection, ran again on a new one.
    assert worker.pid not in {w.pid for w in jq.workers()}
    jq.close()
