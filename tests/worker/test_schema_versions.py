"""A worker refuses a schema older than its code, and says so when the schema
is newer (a worker left behind by a rolling deploy), on both backends, as a
thread and as a real worker process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from e2e.helpers import processes, wait_exit
from jobkeeper import DatabaseError, JobQueue, JobStatus
from support.db import sql
from support.settings import FAST

from .helpers import running

APP = "tests.flow.app:jq"


def migrate_to_one_before_the_latest(jq: JobQueue, monkeypatch: pytest.MonkeyPatch) -> int:
    """Migrate ``jq``'s database to the version before this code's; return it."""
    module = sys.modules[type(jq.backend).__module__]
    older = module.MIGRATIONS[:-1]
    with monkeypatch.context() as patch:
        patch.setattr(module, "MIGRATIONS", older)
        assert jq.migrate() == older[-1][0]
    return int(older[-1][0])


def worker_rows(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM jobkeeper_workers")[0][0])


@pytest.mark.parametrize("burst", [True, False], ids=["burst", "long-running"])
def test_a_worker_refuses_a_schema_behind_its_code(db_url, monkeypatch, burst):
    with JobQueue(db_url, **FAST) as jq:
        have = migrate_to_one_before_the_latest(jq, monkeypatch)
        want = jq.backend.schema_expected()
        message = (
            f"schema is at version {have}, behind this jobkeeper's {want} "
            r"-- run `jobkeeper migrate`"
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
    assert f"schema is at version {have}, behind this jobkeeper's {want}" in log
    assert "run `jobkeeper migrate`" in log
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


def test_a_worker_on_a_newer_schema_runs_and_warns_once(db_url, caplog):
    with JobQueue(db_url, **FAST) as jq:
        jq.migrate()
        ahead = ahead_by_one(db_url)

        @jq.task(name="echo")
        def echo() -> str:
            return "ran"

        job = echo.enqueue()
        stats = jq.worker(burst=True).run()
        assert stats.exit_code == 0
        done = jq.get_job(job.id)
        assert done is not None and done.status is JobStatus.COMPLETED
        warnings = [r.getMessage() for r in caplog.records if "ahead of this" in r.getMessage()]
        want = jq.backend.schema_expected()
        assert len(warnings) == 1, warnings
        assert f"schema is at version {ahead}, ahead of this jobkeeper's {want}" in warnings[0]
        assert "upgrade it" in warnings[0]


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
    assert log.count(f"schema is at version {ahead}, ahead of this jobkeeper's") == 1
    ids = ", ".join(str(job.id) for job in jobs)
    statuses = sql(db_url, f"SELECT status FROM jobkeeper_jobs WHERE id IN ({ids})")
    assert sorted(row[0] for row in statuses) == [JobStatus.COMPLETED.value] * 3
    assert len(Path(record).read_text().splitlines()) == 3
