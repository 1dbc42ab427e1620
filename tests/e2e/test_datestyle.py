"""PostgreSQL sessions whose DateStyle is not ISO (here ``SQL, DMY``, set
through the URL's options, as ``ALTER DATABASE ... SET datestyle`` or
``PGDATESTYLE`` would): psycopg parses timestamptz text only in ISO, so every
read of a timestamp raised NotImplementedError. A SIGKILLed worker's job was
never rescued (the rescuer failed every pass), periodic jobs never fired, and
``jobs show``/``jobs list``/``status``/``doctor`` and the async API crashed.
Our sessions now switch themselves to ISO; a caller's own connection
(``connection=``) is refused with what to set, before anything is written.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

from jobkeeper import ConfigError, JobQueue, current_job
from support.cli import Cli
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for

from .helpers import processes, read_records, wait_exit

pytestmark = pytest.mark.slow

DATESTYLE = "SQL, DMY"


def with_datestyle(url: str, datestyle: str = DATESTYLE) -> str:
    """``url`` whose sessions start with ``datestyle`` (added to its options)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    option = "-cDateStyle=" + datestyle.replace(" ", "")
    query["options"] = f"{query.get('options', '')} {option}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


@pytest.fixture
def url(pg_url: str) -> str:
    """A fresh schema's URL whose sessions start with DateStyle ``SQL, DMY``."""
    url = with_datestyle(pg_url)
    with psycopg.connect(url) as conn:  # the setting does reach the session
        assert conn.info.parameter_status("DateStyle") == DATESTYLE
    return url


def state(url: str, job_id: int) -> tuple[str, int]:
    rows = sql(url, "SELECT status, attempt FROM jobkeeper_jobs WHERE id = ?", (job_id,))
    return (str(rows[0][0]), int(rows[0][1])) if rows else ("", 0)


@pytest.fixture
def jq(url: str):
    with JobQueue(url, **FAST) as queue:
        queue.migrate()
        yield queue


def test_a_sigkilled_workers_job_is_rescued_and_the_cli_reads_it(jq, url, tmp_path, capsys):
    record = tmp_path / "runs.log"
    job = jq.enqueue("sleep", {"seconds": 3.0, "record": str(record)})
    with processes(tmp_path) as procs:
        a = procs.worker(url, FAST, concurrency=1)
        wait_for(lambda: read_records(record), what="worker A to start the job")
        wait_for(lambda: state(url, job.id)[0] == "running", what="its start mark")
        a.send_signal(signal.SIGKILL)
        assert wait_exit(a) == -signal.SIGKILL
        b = procs.worker(url, FAST, concurrency=1)
        # Read raw: what is tested here is the workers' own sessions.
        wait_for(lambda: state(url, job.id) == ("completed", 2), what="the job rescued")
        # With B registered (doctor crashed on the workers' heartbeats).
        cli = Cli(url, capsys)
        shown = cli.json("jobs", "show", str(job.id))
        assert shown["status"] == "completed" and shown["attempt"] == 2
        assert [row["id"] for row in cli.json("jobs", "list")] == [job.id]
        status = cli.json("status")
        assert b.pid in {worker["pid"] for worker in status["workers"]}, status
        code, out, err = cli("doctor")
        assert code == 0 and "Traceback" not in out + err, out + err
        assert b.poll() is None
    done = jq.get_job(job.id)
    assert done.result["pid"] == b.pid
    assert "worker lost" in done.errors[0]["error"]
    assert done.finished_at is not None and done.created_at <= done.finished_at


def test_a_periodic_job_fires(jq, url, tmp_path, capsys):
    argv = [sys.executable, "-m", "jobkeeper", "--database", url, "worker"]
    argv += ["--app", "tests.periodic.apps:jq", "--concurrency", "1"]
    with processes(tmp_path) as procs:
        worker = procs.spawn(argv, settings=FAST, name="worker")
        wait_for(
            lambda: sql(
                url, "SELECT 1 FROM jobkeeper_jobs WHERE task = 'beat' AND status = 'completed'"
            ),
            what="a tick of the periodic 'beat' to run",
        )
        listed = Cli(url, capsys).json("periodic", "list")
        beat = next(row for row in listed if row["task"] == "beat")
        assert beat["last_tick_at"] is not None, listed
        assert worker.poll() is None


def test_the_async_api_reads_timestamps(jq):
    @jq.task(name="stamp")
    def stamp() -> int:
        return current_job().attempt

    async def run() -> None:
        try:
            single = await jq.enqueue_async("stamp", {})
            many = await jq.enqueue_many_async([("stamp", {})] * 3)
            keyed = await jq.enqueue_async("stamp", {}, unique_key="k")
            again = await jq.enqueue_async("stamp", {}, unique_key="k")
            assert again.id == keyed.id and again.created_at == keyed.created_at
            stored = await jq.get_job_async(single.id)
            assert stored is not None and stored.created_at == single.created_at
            assert len(many) == 3
            await asyncio.to_thread(jq.run_worker, burst=True, concurrency=2)
            assert await jq.wait_async(single.id, timeout=30) == 1
            done = await jq.get_job_async(single.id)
            assert done is not None and done.finished_at is not None
        finally:
            await jq.aclose()

    asyncio.run(run())


def test_a_callers_connection_must_be_iso(jq, url):
    # The caller's session is theirs: refused, nothing written, saying what to set.
    with psycopg.connect(url) as conn:
        with pytest.raises(ConfigError, match="set DateStyle to ISO"):
            jq.enqueue("sleep", {"seconds": 0}, connection=conn)
        conn.execute("SET DateStyle = 'ISO'")
        job = jq.enqueue("sleep", {"seconds": 0}, connection=conn)
    assert [row[0] for row in sql(url, "SELECT id FROM jobkeeper_jobs")] == [job.id]

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            with pytest.raises(ConfigError, match="set DateStyle to ISO"):
                await jq.enqueue_async("sleep", {"seconds": 0}, connection=conn)
        await jq.aclose()

    asyncio.run(run())
    assert len(sql(url, "SELECT id FROM jobkeeper_jobs")) == 1
