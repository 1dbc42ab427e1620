"""migrate behind a long transaction: it waits in bounded tries, says whom it
waits for, and gives up after ``lock_wait`` with nothing changed.

Break-test 89: behind ``BEGIN; SELECT count(*) FROM jobkeeper_jobs;
SELECT pg_sleep(45)``, PostgreSQL's migrate waited 43 s for the jobs table's
lock, silent, and every enqueue and claim queued behind its waiting request.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from jobkeeper import ConfigError, DatabaseUnavailable, JobQueue
from jobkeeper.backends.postgres.schema import LOCK_TIMEOUT, migration_lock_key
from support.db import migrate_to, sql

from .test_schema import LATEST

#: The longest a producer's insert may take while migrate waits: one try's
#: lock_timeout, and room for a loaded test machine; without the tries it
#: waits until the holder ends, 7 s on.
LONGEST_INSERT = LOCK_TIMEOUT + 3.0


def older_schema(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with JobQueue(url) as jq:
        migrate_to(jq, LATEST - 1, monkeypatch)


def migrate_process(url: str, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobkeeper", "--database", url, "migrate", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def hold_jobs_table(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A session in a transaction that has read the jobs table (ACCESS SHARE
    held until it ends), as the break-test's psql did.
    """
    holder = psycopg.connect(url)
    holder.execute("SELECT count(*) FROM jobkeeper_jobs").fetchone()
    return holder


def insert_latencies(url: str, seconds: float) -> list[float]:
    """An older producer's inserts, one after another for ``seconds``: how
    long each took.
    """
    took: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.monotonic()
            conn.execute("INSERT INTO jobkeeper_jobs (queue, task) VALUES ('default', 'produced')")
            took.append(time.monotonic() - started)
            time.sleep(0.05)
    return took


def test_postgres_migrates_wait_in_tries_that_let_enqueues_through(pg_url, monkeypatch):
    older_schema(pg_url, monkeypatch)
    holder = hold_jobs_table(pg_url)
    pid = holder.info.backend_pid
    # Ended from the side: without bounded tries the inserts below queue
    # behind migrate's waiting lock until then, and the check on them fails
    # rather than hangs.
    ender = threading.Timer(8.0, holder.commit)
    migrates = [migrate_process(pg_url, "--lock-wait", "60") for _ in range(2)]
    try:
        ender.start()
        time.sleep(1.0)  # both at their first try
        took = insert_latencies(pg_url, 5.0)
        assert max(took) < LONGEST_INSERT, sorted(took)[-5:]
        outcomes = [m.communicate(timeout=60) for m in migrates]
    finally:
        ender.cancel()
        for m in migrates:
            if m.poll() is None:
                m.kill()
        holder.close()
    assert [m.returncode for m in migrates] == [0, 0], outcomes
    for out, _ in outcomes:
        assert f"schema at version {LATEST}" in out
    # Whichever migrate met the holder said who it is; the other may have
    # waited for the first migrate instead.
    err = "".join(e for _, e in outcomes)
    assert f"held by pid {pid} (" in err, err
    assert "transaction open" in err and "SELECT count(*) FROM jobkeeper_jobs" in err, err
    with JobQueue(pg_url) as jq:
        assert jq.backend.schema_version() == LATEST


def test_postgres_migrate_gives_up_after_lock_wait_with_nothing_changed(pg_url, monkeypatch):
    older_schema(pg_url, monkeypatch)
    holder = hold_jobs_table(pg_url)
    try:
        started = time.monotonic()
        migrate = migrate_process(pg_url, "--lock-wait", "3")
        _, err = migrate.communicate(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        pid = holder.info.backend_pid
        holder.rollback()
        holder.close()
    assert migrate.returncode == 1, err
    lines = err.strip().splitlines()
    # The seconds it waited in all: lock_wait, and on a loaded machine a try
    # that began before it ran out (a full run said 4 s).
    assert re.match(r"error: migrate gave up after \d+ s waiting for a lock", lines[-1]), err
    assert "(lock_wait=3 s)" in lines[-1], err
    assert f"held by pid {pid} (" in lines[-1], err
    assert "SELECT count(*) FROM jobkeeper_jobs" in lines[-1], err
    assert f"still at version {LATEST - 1}" in lines[-1], err
    # Each try before the last said whom it waits for.
    assert any(line.startswith("migrate is waiting for a lock") for line in lines[:-1]), err
    assert elapsed < 3 + 10, elapsed
    with JobQueue(pg_url) as jq:
        assert jq.backend.schema_version() == LATEST - 1


@pytest.mark.parametrize("pool_size", [10, 1])
def test_postgres_migrate_waits_for_another_migrate_and_says_so(
    pg_url, monkeypatch, caplog, pool_size
):
    # Waiting for the migration lock holds no enqueue up: it is one wait,
    # named, bounded by lock_wait too. Who holds it is read on migrate's own
    # connection: with pool_size=1 a second one never came (PoolTimeout).
    from jobkeeper.backends.postgres import sources

    monkeypatch.setattr(sources, "POOL_TIMEOUT", 3.0)
    older_schema(pg_url, monkeypatch)
    holder = psycopg.connect(pg_url, autocommit=True)
    schema = holder.execute("SELECT current_schema()").fetchone()[0]
    holder.execute("SELECT pg_advisory_lock(%s)", (migration_lock_key(schema),))
    try:
        with JobQueue(pg_url, pool_size=pool_size) as jq, caplog.at_level(logging.WARNING):
            with pytest.raises(DatabaseUnavailable, match="migrate gave up after") as raised:
                jq.migrate(lock_wait=1.5)
            pid = holder.info.backend_pid
            assert f"the migration lock (lock_wait=1.5 s), held by pid {pid}" in str(raised.value)
            assert jq.backend.schema_version() == LATEST - 1
        said = [r.getMessage() for r in caplog.records if "another migrate" in r.getMessage()]
        assert said and all(f"pid {holder.info.backend_pid} " in line for line in said), said
    finally:
        holder.close()


def test_migrate_refuses_a_lock_wait_that_is_no_duration(db_url):
    with JobQueue(db_url) as jq:
        for bad in (0, -1, float("nan"), "5"):
            with pytest.raises(ConfigError, match="lock_wait must be"):
                jq.migrate(lock_wait=bad)  # type: ignore[arg-type]
        assert jq.backend.schema_version() == 0


def test_sqlite_migrate_says_it_waits_for_the_write_lock_and_gives_up(
    sqlite_url, monkeypatch, caplog
):
    older_schema(sqlite_url, monkeypatch)
    path = sqlite_url.removeprefix("sqlite:///")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with JobQueue(sqlite_url) as jq, caplog.at_level(logging.WARNING):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match=r"gave up after 3 s \(lock_wait\)"):
                jq.migrate(lock_wait=3)
            assert 2.5 < time.monotonic() - started < 10
            assert jq.backend.schema_version() == LATEST - 1
            said = [r.getMessage() for r in caplog.records]
            assert any("waiting for the write lock of" in m for m in said), said
            # Released while it waits: it goes on.
            threading.Timer(3.0, holder.rollback).start()
            assert jq.migrate(lock_wait=30) == LATEST
    finally:
        holder.close()
    assert sql(sqlite_url, "SELECT max(version) FROM jobkeeper_schema") == [(LATEST,)]


def test_cli_migrate_refuses_a_bad_lock_wait_by_its_option(sqlite_url):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobkeeper",
            "--database",
            sqlite_url,
            "migrate",
            "--lock-wait",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: --lock-wait must be a finite number of seconds > 0, got 0"
    with JobQueue(sqlite_url) as jq:
        assert jq.backend.schema_version() == 0


def test_postgres_migrate_does_not_wait_for_a_migrate_of_another_schema(
    pg_url, other_pg_url, monkeypatch, caplog
):
    # One lock for the whole database made migrates of separate schemas wait
    # for each other, named the other schema's migrate as the one to end, and
    # gave up after lock_wait (a CI run: "waiting for the migration lock" of
    # another test's schema). Here the other schema's migrate holds its lock,
    # whatever its key, until this one has finished.
    from jobkeeper.backends.postgres import schema as schema_module

    under_lock = threading.Event()
    release = threading.Event()
    real_apply = schema_module.apply_migrations

    def apply_when_released(*args, **kwargs):
        if threading.current_thread().name == "other-migrate":
            under_lock.set()
            release.wait(30)
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(schema_module, "apply_migrations", apply_when_released)
    outcome: list[object] = []
    with JobQueue(other_pg_url) as other_jq, JobQueue(pg_url) as jq:
        migrating = threading.Thread(
            target=lambda: outcome.append(other_jq.migrate(lock_wait=30)),
            name="other-migrate",
        )
        migrating.start()
        assert under_lock.wait(10)
        try:
            with caplog.at_level(logging.WARNING):
                assert jq.migrate(lock_wait=1.0) == LATEST
        finally:
            release.set()
            migrating.join(30)
    assert outcome == [LATEST]
    assert not [r for r in caplog.records if "another migrate" in r.getMessage()]


def test_a_holder_whose_transaction_began_after_ours_is_not_open_for_minus_0_s():
    from jobkeeper.backends.postgres.schema import held_by

    holder = {"pid": 7, "application_name": "", "state": "active", "open_for": -0.3, "query": ""}
    assert "transaction open 0 s" in held_by([holder])
