"""PostgreSQL: jobkeeper's tables live in the current schema, the first of
the search path. With ``search_path=tenant,public``, the tenant not migrated
yet and public migrated, every statement found public's tables: the new
tenant's worker ran public's jobs and its enqueues landed there
(break-test 103). Now nothing of the tenant's reaches public's tables, and
what reads the schema version says why.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.migrate import MisplacedSchemaError, MissingSchemaError
from support.db import sql


@pytest.fixture
def tenant_url(pg_url: str) -> Iterator[str]:
    """A URL whose search path is a new, unmigrated schema, then pg_url's
    migrated one (which holds one job).
    """
    below = pg_url.rsplit("search_path%3D", 1)[1]
    tenant = f"{below}_tenant"
    with JobQueue(pg_url) as jq:
        jq.migrate()
        jq.enqueue("below.job", {"x": 1})
    sql(pg_url, f'CREATE SCHEMA "{tenant}"')
    try:
        yield pg_url.replace(f"search_path%3D{below}", f"search_path%3D{tenant}%2C{below}")
    finally:
        sql(pg_url, f'DROP SCHEMA "{tenant}" CASCADE')


def _burst_worker(url: str) -> subprocess.CompletedProcess[str]:
    command = ["worker", "--app", "tests.e2e.apps:jq", "--burst"]
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", "--database", url, *command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _rows_below(pg_url: str) -> list[tuple[object, ...]]:
    return sql(pg_url, "SELECT task, status FROM jobkeeper_jobs ORDER BY id")


def test_an_unmigrated_first_schema_reaches_nothing_further_down(pg_url, tenant_url):
    with JobQueue(tenant_url) as jq:
        with pytest.raises(MisplacedSchemaError) as raised:
            jq.backend.schema_version()
        message = str(raised.value)
        tenant = tenant_url.rsplit("search_path%3D", 1)[1].split("%2C")[0]
        assert f"not in schema {tenant!r}, the first of the search path" in message
        assert "put" in message and "first in the URL's search_path" in message
        assert "migrate" in message
        # Each statement says why, not only "run migrate" (which, in the
        # "$user", public case, would make a second, empty installation).
        with pytest.raises(MisplacedSchemaError, match="not in schema"):
            jq.enqueue("tenant.job", {"x": 2})
        for read in (lambda: jq.get_job(1), jq.stats, jq.queue_counts):
            with pytest.raises(MisplacedSchemaError, match="not in schema"):
                read()
    assert _rows_below(pg_url) == [("below.job", "available")]


def test_an_unmigrated_first_schema_reaches_nothing_further_down_async(pg_url, tenant_url):
    async def enqueue() -> None:
        jq = JobQueue(tenant_url)
        try:
            await jq.enqueue_async("tenant.job", {"x": 2})
        finally:
            await jq.aclose()
            jq.close()

    with pytest.raises(MisplacedSchemaError, match="not in schema"):
        asyncio.run(enqueue())
    assert _rows_below(pg_url) == [("below.job", "available")]


def test_a_worker_refuses_to_start_and_migrate_gives_the_tenant_its_own(pg_url, tenant_url):
    worker = _burst_worker(tenant_url)
    assert worker.returncode == 1, worker.stderr
    assert "jobkeeper's tables are not in schema" in worker.stderr, worker.stderr
    assert _rows_below(pg_url) == [("below.job", "available")]

    with JobQueue(tenant_url) as jq:
        assert jq.migrate() == jq.backend.schema_expected()
        job = jq.enqueue("tenant.job", {"x": 2})
        assert [j.task for j in jq.list_jobs()] == ["tenant.job"]
        assert job.id == 1
    assert _rows_below(pg_url) == [("below.job", "available")]


def test_a_search_path_of_no_existing_schema_is_named_by_every_reader(pg_url):
    # doctor, status and a worker said "not migrated: run migrate", and that
    # migrate then failed: "no schema has been selected to create in".
    below = pg_url.rsplit("search_path%3D", 1)[1]
    url = pg_url.replace(f"search_path%3D{below}", "search_path%3DNoSuch")
    with JobQueue(url) as jq:
        with pytest.raises(MissingSchemaError, match="no schema of the search_path exists"):
            jq.backend.schema_version()
        with pytest.raises(MissingSchemaError, match="%22Tenant3%22"):
            jq.migrate()
    worker = _burst_worker(url)
    assert worker.returncode == 1, worker.stderr
    assert "no schema of the search_path exists" in worker.stderr, worker.stderr


def test_a_callers_connection_whose_search_path_finds_another_schemas_tables_is_refused(
    pg_url, tenant_url
):
    # Break-test 108: the queue's own connections were pinned, but the
    # caller's connection= still found public's table, and the job landed in
    # the other tenant's queue (sync and async).
    with JobQueue(tenant_url) as jq, psycopg.connect(tenant_url) as conn:
        with pytest.raises(MisplacedSchemaError, match="not in schema"):
            jq.enqueue("tenant.job", {"x": 2}, connection=conn)
        conn.rollback()

    async def enqueue_async() -> None:
        jq = JobQueue(tenant_url)
        try:
            async with await psycopg.AsyncConnection.connect(tenant_url) as conn:
                await jq.enqueue_async("tenant.job", {"x": 3}, connection=conn)
        finally:
            await jq.aclose()
            jq.close()

    with pytest.raises(MisplacedSchemaError, match="not in schema"):
        asyncio.run(enqueue_async())
    assert _rows_below(pg_url) == [("below.job", "available")]
