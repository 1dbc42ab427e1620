"""A worker started while its database is unreachable waits for it."""

from __future__ import annotations

import secrets
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import psycopg
import pytest

from jobkeeper import DatabaseError, DatabaseUnavailable, JobQueue, JobStatus
from jobkeeper.worker import burst as burst_module
from jobkeeper.worker.burst import BURST_CLAIM_FAILURES
from support.db import PG_URL, pg_database_url
from support.settings import FAST
from support.waiting import wait_status

from .helpers import running


@pytest.fixture
def refusing_database():
    """A migrated database holding one job, that refuses connections until
    ``allow()`` is called (an outage of that database alone)."""
    name = f"jk_start_{secrets.token_hex(4)}"
    admin = psycopg.connect(PG_URL, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = pg_database_url(name)
    setup = JobQueue(url, **FAST)
    setup.migrate()
    job = setup.enqueue("startup.echo", {"x": 1})
    setup.close()
    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')

    def allow() -> None:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    try:
        yield url, job.id, allow
    finally:
        allow()
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


def test_a_worker_waits_for_the_database_then_runs_its_jobs(refusing_database, caplog):
    url, job_id, allow = refusing_database
    jq = JobQueue(url, **FAST)

    @jq.task(name="startup.echo")
    def echo(x: int) -> int:
        return x

    try:
        with running(jq.worker(concurrency=2)) as handle:
            deadline = time.monotonic() + 10
            while "database unavailable at start" not in caplog.text:
                assert time.monotonic() < deadline, "no warning while waiting"
                assert handle.thread.is_alive(), "the worker gave up"
                time.sleep(0.05)
            allow()
            (done,) = wait_status(jq, [job_id], {JobStatus.COMPLETED})
            assert done.result == 1
    finally:
        jq.close()


def test_a_waiting_worker_stops_cleanly(refusing_database, caplog):
    caplog.set_level("INFO", logger="jobkeeper")
    url, _, _ = refusing_database
    jq = JobQueue(url, **FAST)
    try:
        with running(jq.worker()) as handle:
            deadline = time.monotonic() + 10
            while "database unavailable at start" not in caplog.text:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert handle.stats.claimed == 0
        # It never started: no tally of zeros, which would read as a run.
        assert "stopped before it started" in caplog.text
        assert "stopped: 0 claimed" not in caplog.text
    finally:
        jq.close()


def test_a_burst_worker_fails_at_once(refusing_database, caplog):
    url, _, _ = refusing_database
    jq = JobQueue(url, **FAST)
    try:
        with pytest.raises(DatabaseUnavailable, match="not currently accepting connections"):
            jq.run_worker(burst=True)
    finally:
        jq.close()
    # The reason is a log record too (a log pipeline never sees the raise).
    assert _error_records(caplog, "not currently accepting connections")


def _error_records(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelname == "ERROR"
        and record.name == "jobkeeper.worker"
        and text in record.getMessage()
    ]


def test_a_worker_on_a_missing_sqlite_file_says_it_never_started(tmp_path, caplog):
    caplog.set_level("INFO", logger="jobkeeper")
    jq = JobQueue(f"sqlite:///{tmp_path / 'never-migrated.db'}", **FAST)
    try:
        with pytest.raises(DatabaseError, match="does not exist"):
            jq.run_worker(burst=True)
    finally:
        jq.close()
    assert "stopped before it started" in caplog.text
    assert " started on " not in caplog.text and "stopped: 0 claimed" not in caplog.text
    (error,) = _error_records(caplog, "does not exist")
    assert "stopped on an error" in error


def _text_file(path):
    path.write_bytes(b"not a database, " * 512)


def _truncated_database(path):
    whole = path.with_suffix(".whole")
    setup = JobQueue(f"sqlite:///{whole}")
    setup.migrate()
    setup.close()  # the last connection out checkpoints the WAL into the file
    data = whole.read_bytes()
    assert len(data) > 16384
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_text_file, "is not a SQLite database"),
        (_truncated_database, "is (damaged|not a SQLite database)"),
        (lambda path: path.mkdir(), "is a directory"),
        (lambda path: path.write_bytes(b""), r"is empty \(0 bytes\)"),
    ],
    ids=["text", "truncated", "directory", "empty"],
)
def test_a_file_that_is_not_a_database_fails_at_once_and_is_left_alone(
    tmp_path, caplog, make, message
):
    # None of these passes with time: a worker that took it for an outage
    # (DatabaseUnavailable) would wait on it forever. SQLite would make an
    # empty file a database: only migrate may.
    path = tmp_path / "jobs.db"
    make(path)
    before = path.read_bytes() if path.is_file() else None
    jq = JobQueue(f"sqlite:///{path}", **FAST)
    try:
        with pytest.raises(DatabaseError, match=message) as raised:
            jq.enqueue("t", {})
        assert not isinstance(raised.value, DatabaseUnavailable)
        with pytest.raises(DatabaseError, match=message):
            jq.stats()
        started = time.monotonic()
        with pytest.raises(DatabaseError, match=message) as raised:
            jq.run_worker()  # not burst: an outage would be waited out
        assert not isinstance(raised.value, DatabaseUnavailable)
        assert time.monotonic() - started < 10
    finally:
        jq.close()
    assert (path.read_bytes() if path.is_file() else None) == before
    assert "database unavailable at start" not in caplog.text


def test_a_burst_worker_stops_on_a_table_damaged_under_it(tmp_path, caplog):
    # The file opens and the worker registers, but every claim reads a
    # damaged page of the jobs table: a burst worker retried the claim
    # every poll_interval for ever ("claim failed; retrying"), hanging the
    # script that ran it. It now stops with the error after a few claims.
    path = tmp_path / "jobs.db"
    setup = JobQueue(f"sqlite:///{path}", **FAST)
    setup.migrate()
    setup.enqueue_many([("t", {"pad": "x" * 200})] * 500)
    setup.close()  # the last connection out checkpoints the WAL into the file
    with sqlite3.connect(path) as conn:
        root = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'jobkeeper_jobs'"
        ).fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with path.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xff" * 64)
    jq = JobQueue(f"sqlite:///{path}", **FAST)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="malformed") as raised:
            jq.run_worker(burst=True)
        assert not isinstance(raised.value, DatabaseUnavailable)
        assert time.monotonic() - started < 30
    finally:
        jq.close()
    assert f"{BURST_CLAIM_FAILURES} claims in a row failed" in caplog.text


def test_a_burst_worker_stops_when_an_outage_outlasts_its_wait(tmp_path, caplog, monkeypatch):
    # A database dropped (or locked) under a burst worker mid-drain was
    # waited on for ever: the script that ran it hung. After
    # BURST_OUTAGE_WAIT it stops with the error; nothing is lost (what it
    # held is rescued and run by the next worker).
    monkeypatch.setattr(burst_module, "BURST_OUTAGE_WAIT", 1.0)
    jq = JobQueue(f"sqlite:///{tmp_path}/jobs.db", **{**FAST, "busy_timeout": 0.2})
    started = threading.Event()

    @jq.task(name="slow")
    def slow() -> None:
        started.set()
        time.sleep(0.5)

    jq.migrate()
    ids = [job.id for job in jq.enqueue_many([("slow", {})] * 6)]
    raised: list[BaseException] = []

    def burst() -> None:
        try:
            jq.run_worker(burst=True, concurrency=1)
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=burst)
    worker.start()
    assert started.wait(10)
    with sqlite3.connect(tmp_path / "jobs.db", isolation_level=None) as locker:
        locker.execute("BEGIN IMMEDIATE")  # every write waits, then is an outage
        worker.join(30)
        locker.execute("ROLLBACK")
    locker.close()
    assert not worker.is_alive(), "the burst worker still waits on the outage"
    assert raised and isinstance(raised[0], DatabaseUnavailable), raised
    assert "stopping" in caplog.text and "burst:" in caplog.text
    jq.run_worker(burst=True)  # after rescue_after: what it held is run now
    done = wait_status(jq, ids, {JobStatus.COMPLETED}, timeout=30)
    assert len(done) == 6
    jq.close()


def test_a_burst_worker_paused_past_its_outage_wait_goes_on(tmp_path):
    # A pause is no outage: a burst worker SIGSTOPped past its outage wait
    # (3 s against a 1 s bound) finishes its work on SIGCONT. The bound
    # counts from when the producer saw its heartbeat stale, by its own
    # clock; whether the producer looks before the heartbeat thread beats
    # again is a race, so this run does not always catch a bound counted
    # from the heartbeat's age instead.
    url = f"sqlite:///{tmp_path}/jobs.db"
    jq = JobQueue(url, **FAST)
    jq.migrate()
    ids = [job.id for job in jq.enqueue_many([("slow", {})] * 20)]
    script = textwrap.dedent(
        f"""
        import time
        from jobkeeper import JobQueue
        from jobkeeper.worker import burst
        burst.BURST_OUTAGE_WAIT = 1.0
        jq = JobQueue({url!r}, heartbeat_interval=0.1, rescue_after=30.0, poll_interval=0.05)

        @jq.task(name="slow")
        def slow() -> None:
            time.sleep(0.1)

        print("started", flush=True)
        jq.run_worker(burst=True, concurrency=1)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
            time.sleep(0.5)
            proc.send_signal(signal.SIGSTOP)
            time.sleep(3.0)
            proc.send_signal(signal.SIGCONT)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    done = wait_status(jq, ids, {JobStatus.COMPLETED}, timeout=30)
    assert len(done) == 20
    jq.close()
