"""jobkeeper's tables whose record of schema versions was emptied or dropped:
``migrate`` read them as "not migrated" and failed with "table jobkeeper_jobs
already exists" while ``doctor`` kept advising ``migrate``. Both backends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobkeeper import DatabaseError, JobQueue, JobStatus
from jobkeeper.doctor import run_checks
from support.db import count, is_pg, sql

DEPLOYING = Path(__file__).resolve().parents[2] / "docs" / "deploying.md"
REFUSED = "jobkeeper_schema records no schema version, yet a jobkeeper_jobs table exists"


def recording_sql(target: object, version: int) -> list[str]:
    """The statements docs/deploying.md gives to record ``version`` by hand,
    for ``target``'s backend."""
    section = DEPLOYING.read_text().split("### A lost schema record", 1)[1]
    block = re.search(r"```sql\n(.*?)```", section, re.S)
    assert block is not None
    postgres, sqlite = block.group(1).split("-- SQLite")
    text = postgres if is_pg(target) else sqlite
    text = text.replace("(17", f"({version}")
    return [part.strip() for part in text.split(";") if part.strip().strip("-").strip()]


@pytest.mark.parametrize("how", ["emptied", "dropped"])
def test_migrate_refuses_tables_without_a_schema_record_and_changes_nothing(db_url, how):
    with JobQueue(db_url) as jq:
        want = jq.migrate()
        ids = [jq.enqueue("echo", {"n": n}, external=True).id for n in range(3)]
        lose = {"emptied": "DELETE FROM", "dropped": "DROP TABLE"}[how]
        sql(db_url, f"{lose} jobkeeper_schema")
    with JobQueue(db_url) as jq:
        with pytest.raises(DatabaseError, match=REFUSED) as refused:
            jq.migrate()
        assert f"this jobkeeper's is {want}" in str(refused.value)
        with pytest.raises(DatabaseError, match=REFUSED):
            jq.backend.schema_version()
        checks = run_checks(jq)
        assert [c.level for c in checks] == ["fail"]
        assert REFUSED in checks[0].message
        # Naming the database: a bare `jobkeeper migrate` migrates the default one.
        assert jq.url.migrate_hint() in checks[0].message
        assert "`jobkeeper --database " in str(refused.value)
    # Nothing was written: the record is as it was left, the jobs are there.
    if how == "emptied":
        assert count(db_url, "jobkeeper_schema") == 0
    else:
        with pytest.raises(Exception, match="jobkeeper_schema"):
            sql(db_url, "SELECT count(*) FROM jobkeeper_schema")
    assert count(db_url) == 3

    # The docs' statements put the record back; migrate then has nothing to do.
    for statement in recording_sql(db_url, want):
        sql(db_url, statement)
    with JobQueue(db_url) as jq:
        assert jq.migrate() == want
        assert [c.level for c in run_checks(jq) if c.name == "schema"] == ["ok"]

        @jq.task(name="echo")
        def echo(n: int) -> int:
            return n

        assert jq.worker(burst=True).run().exit_code == 0
        for job_id in ids:
            job = jq.get_job(job_id)
            assert job is not None and job.status is JobStatus.COMPLETED


def test_a_fresh_database_is_still_created(db_url):
    with JobQueue(db_url) as jq:
        assert jq.backend.schema_version() == 0
        assert jq.migrate() == jq.backend.schema_expected()


def test_postgres_tables_further_down_the_search_path_are_no_lost_record(pg_url):
    # With "tenant, public", migrate creates the tenant's tables in tenant:
    # the check looked through the whole search path and refused them
    # because public had jobkeeper's tables (break-test 72).
    schema = pg_url.rsplit("search_path%3D", 1)[1]
    tenant = f"{schema}_tenant"
    unrelated = f"{schema}_unrelated"
    sql(pg_url, f'CREATE SCHEMA "{tenant}"')
    sql(pg_url, f'CREATE SCHEMA "{unrelated}"')
    sql(pg_url, f'CREATE TABLE "{unrelated}".jobkeeper_jobs (id int)')
    try:
        with JobQueue(pg_url) as jq:
            want = jq.migrate()
        for below in (schema, unrelated):
            path = f"{tenant}_{below[-8:]}"
            sql(pg_url, f'CREATE SCHEMA "{path}"')
            try:
                url = pg_url.replace(f"search_path%3D{schema}", f"search_path%3D{path}%2C{below}")
                with JobQueue(url) as jq:
                    assert jq.migrate() == want
                    assert [c.level for c in run_checks(jq) if c.name == "schema"] == ["ok"]
                tables = sql(
                    pg_url,
                    "SELECT count(*) FROM pg_tables WHERE schemaname = ? "
                    "AND tablename IN ('jobkeeper_jobs', 'jobkeeper_schema')",
                    (path,),
                )
                assert tables == [(2,)]
            finally:
                sql(pg_url, f'DROP SCHEMA "{path}" CASCADE')
    finally:
        sql(pg_url, f'DROP SCHEMA "{tenant}" CASCADE')
        sql(pg_url, f'DROP SCHEMA "{unrelated}" CASCADE')
