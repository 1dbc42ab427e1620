"""A worker refuses a schema older than its code, and says so when the schema
is newer (a worker left behind by a rolling deploy), on both backends, as a
thread and as a real worker process."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from e2e.helpers import processes, wait_exit
from jobkeeper import DatabaseError, JobQueue, JobStatus
from support.db import PG_URL, migrate_to, sql, url_of
from support.settings import FAST
from support.waiting import wait_for

from .helpers import running

APP = "tests.flow.app:jq"


def migrate_to_one_before_the_latest(jq: JobQueue, monkeypatch: pytest.MonkeyPatch) -> int:
    """Migrate ``jq``'s database to the version before this code's; return it."""
    older = jq.backend.schema_expected() - 1
    migrate_to(jq, older, monkeypatch)
    return older


def worker_rows(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM jobkeeper_workers")[0][0])


@pytest.mark.parametrize("burst", [True, False], ids=["burst", "long-running"])
def test_a_worker_refuses_a_schema_behind_its_code(db_url, monkeypatch, burst):
    with JobQueue(db_url, **FAST) as jq:
        have = migrate_to_one_before_the_latest(jq, monkeypatch)
        want = jq.backend.schema_expected()
        # The database is named: one of several that a process uses may lag.
        where = re.escape(jq.url.redacted())
        message = (
            f"schema of {where} is at version {have}, behind this jobkeeper's {want} "
            rf"-- {re.escape(jq.url.migrate_hint())}"
        )
        # At once, not after an outage's wait: migrating is someone's job.
        with pytest.raises(DatabaseError, match=message), running(jq.worker(burst=burst)) as handle:
            handle.join(timeout=10)
        assert worker_rows(db_url) == 0
        assert jq.migrate() == want


def test_a_worker_process_on_a_schema_behind_it_exits_1_and_says_why(db_url, monkeypatch, tmp_path):
    with JobQueue(db_url) as jq:
        have = migrate_to_one_before_the_latest(jq, monkeypatch)
        want = jq.backend.schema_expected()
    argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker", "--app", APP]
    with processes(tmp_path) as procs:
        worker = procs.spawn(argv, settings=FAST, name="worker")
        assert wait_exit(worker, timeout=60) == 1
        log = procs.log(worker)
    assert f"is at version {have}, behind this jobkeeper's {want}" in log
    assert jq.url.migrate_hint() in log
    assert worker_rows(db_url) == 0


def ahead_by_one(url: str) -> int:
    """Record one schema version more than this code knows (a newer release
    migrated the database); return it."""
    sql(
        url,
        "INSERT INTO jobkeeper_schema (version, applied_at) "
        "SELECT max(version) + 1, max(applied_at) FROM jobkeeper_schema",
    )
    return int(sql(url, "SELECT max(version) FROM jobkeeper_schema")[0][0])


def assert_warned_once_of(jq: JobQueue, ahead: int, caplog: pytest.LogCaptureFixture) -> None:
    """One warning, naming this code's schema version and ``ahead``."""
    warnings = [r.getMessage() for r in caplog.records if "upgrade it" in r.getMessage()]
    want = jq.backend.schema_expected()
    assert len(warnings) == 1, warnings
    assert (
        f"whose schema version is {want}, on {jq.url.redacted()} at version {ahead}"
        in (warnings[0])
    )


def test_a_worker_on_a_newer_schema_runs_and_warns_once(db_url, caplog):
    with JobQueue(db_url, **FAST) as jq:
        jq.migrate()
        ahead = ahead_by_one(db_url)

        @jq.task(name="echo")
        def echo() -> str:
            return "ran"

        # Two workers of one process (testing.drain starts one a round): one warning.
        jobs = []
        for _ in range(2):
            jobs.append(echo.enqueue())
            stats = jq.worker(burst=True).run()
            assert stats.exit_code == 0
        for job in jobs:
            done = jq.get_job(job.id)
            assert done is not None and done.status is JobStatus.COMPLETED
        assert_warned_once_of(jq, ahead, caplog)


def test_a_worker_process_on_a_newer_schema_runs_its_jobs(db_url, tmp_path):
    with JobQueue(db_url) as jq:
        jq.migrate()
        ahead = ahead_by_one(db_url)
        record = str(tmp_path / "runs.txt")
        jobs = [jq.enqueue("timed", {"seconds": 0, "record": record}, external=True) for _ in "abc"]
    argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker", "--app", APP]
    with processes(tmp_path) as procs:
        worker = procs.spawn([*argv, "--burst"], settings=FAST, name="worker")
        assert wait_exit(worker, timeout=60) == 0
        log = procs.log(worker)
    assert log.count(f"at version {ahead}: upgrade it") == 1
    ids = ", ".join(str(job.id) for job in jobs)
    statuses = sql(db_url, f"SELECT status FROM jobkeeper_jobs WHERE id IN ({ids})")
    assert sorted(row[0] for row in statuses) == [JobStatus.COMPLETED.value] * 3
    assert len(Path(record).read_text().splitlines()) == 3


def test_a_worker_whose_role_may_not_read_the_schema_version_runs_unchecked(pg_url, caplog):
    # Workers ran with such a role before they read the version; they still do.
    role = f"jk_no_schema_{secrets.token_hex(4)}"
    with JobQueue(pg_url) as setup:
        setup.migrate()
    schema = sql(pg_url, "SELECT current_schema()")[0][0]
    admin = psycopg.connect(PG_URL, autocommit=True)
    try:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        for kind in ("TABLES", "SEQUENCES", "FUNCTIONS"):
            admin.execute(f"GRANT ALL ON ALL {kind} IN SCHEMA {schema} TO {role}")
        admin.execute(f"REVOKE ALL ON {schema}.jobkeeper_schema FROM {role}")
        with JobQueue(pg_url.replace("postgres@", f"{role}@", 1), **FAST) as jq:

            @jq.task(name="echo")
            def echo() -> str:
                return "ran"

            job = echo.enqueue()
            assert jq.worker(burst=True).run().exit_code == 0
            done = jq.get_job(job.id)
            assert done is not None and done.status is JobStatus.COMPLETED
        assert "could not read the schema version" in caplog.text
        assert "permission denied" in caplog.text
    finally:
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.close()


def test_a_running_worker_warns_once_when_a_newer_release_migrates_under_it(db_url, caplog):
    # A worker left running through a rolling deploy's migrate said nothing.
    with JobQueue(db_url, **FAST) as jq:
        jq.migrate()
        worker = jq.worker()
        worker.schema_watch.every = 0.2
        with running(worker):
            # The watch reads after rescue passes (never on the heartbeat's thread).
            wait_for(lambda: worker.rescuer.passes >= 3, what="three rescue passes")
            assert "upgrade it" not in caplog.text
            ahead = ahead_by_one(db_url)
            wait_for(lambda: "upgrade it" in caplog.text, what="the warning of a newer schema")
            # Read again at least twice more: still one warning.
            passes = worker.rescuer.passes
            wait_for(lambda: worker.rescuer.passes >= passes + 4, what="four more rescue passes")
        assert_warned_once_of(jq, ahead, caplog)


def test_migrate_from_an_older_release_applies_nothing_and_says_so(db_url, tmp_path):
    with JobQueue(db_url) as jq:
        jq.migrate()
        ahead = ahead_by_one(db_url)
        assert jq.migrate() == ahead
        want = jq.backend.schema_expected()
    argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "migrate"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"schema at version {ahead}" in done.stdout
    assert f"knows schema versions up to {want}" in done.stderr
    assert "nothing was applied: upgrade jobkeeper here" in done.stderr
    assert int(sql(db_url, "SELECT max(version) FROM jobkeeper_schema")[0][0]) == ahead


def test_a_lock_held_on_the_schema_record_stops_no_heartbeat(pg_url):
    # A restore's TRUNCATE of jobkeeper_schema, left open: the schema watch
    # read on the heartbeat's connection waited behind it, the beats stopped,
    # and a live worker's job was rescued and ran twice (break-test 72).
    with JobQueue(pg_url, **FAST) as jq:
        jq.migrate()
        worker = jq.worker()
        worker.schema_watch.every = 0.1
        with running(worker), psycopg.connect(url_of(pg_url)) as locker:
            wait_for(lambda: worker.rescuer.passes >= 2, what="two rescue passes")
            locker.execute("LOCK TABLE jobkeeper_schema IN ACCESS EXCLUSIVE MODE")
            beats, passes = worker.heartbeat.loop_passes, worker.rescuer.passes
            ages = []
            deadline = time.monotonic() + 3 * FAST["rescue_after"]
            while time.monotonic() < deadline:
                ages.append(worker.heartbeat.beat_age())
                time.sleep(0.05)
            locker.rollback()
            # Beats every 0.1 s throughout, none older than the rescue window.
            assert max(ages) < FAST["rescue_after"] / 2, max(ages)
            assert worker.heartbeat.loop_passes >= beats + 10
            # The watch's read gave up after LOCK_WAIT, so rescue passes went on.
            assert worker.rescuer.passes >= passes + 2
