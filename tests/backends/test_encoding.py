"""A PostgreSQL database whose encoding is not UTF-8 stores and returns args
and results as given, and refuses what its encoding cannot hold.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import psycopg
import pytest

from jobkeeper import DataRejected, JobQueue, JobStatus
from jobkeeper.doctor import run_checks
from support.db import PG_URL, pg_database_url
from support.settings import FAST
from support.waiting import wait_status

TEXT = "café, naïve, ½ £ ß"  # all in LATIN1


def _database_in(encoding: str) -> Iterator[str]:
    name = f"jk_{encoding.lower()}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE \"{name}\" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' "
            "TEMPLATE template0"
        )
    try:
        yield pg_database_url(name)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def latin1_url() -> Iterator[str]:
    yield from _database_in("LATIN1")


@pytest.fixture
def sql_ascii_url() -> Iterator[str]:
    yield from _database_in("SQL_ASCII")


def test_args_and_results_round_trip_in_a_latin1_database(latin1_url):
    # Our sessions spoke the database's encoding; stored JSON is read as
    # UTF-8, so "é" came back as U+FFFD from get_job and to the task.
    jq = JobQueue(latin1_url, **FAST)
    seen: list[str] = []

    @jq.task(name="enc.echo")
    def echo(s: str) -> str:
        seen.append(s)
        return s

    jq.migrate()
    try:
        single = jq.enqueue("enc.echo", {"s": TEXT})
        bulk = jq.enqueue_many([("enc.echo", {"s": TEXT})] * 70)

        async def enqueue_async() -> int:
            job = await jq.enqueue_async("enc.echo", {"s": TEXT})
            await jq.aclose()
            return job.id

        async_id = asyncio.run(enqueue_async())
        ids = [single.id, bulk[0].id, bulk[-1].id, async_id]
        for job_id in ids:
            stored = jq.get_job(job_id)
            assert stored is not None and stored.args == {"s": TEXT}
        jq.run_worker(burst=True, concurrency=4)
        done = wait_status(jq, ids, {JobStatus.COMPLETED})
        assert all(job.result == TEXT for job in done)
        assert set(seen) == {TEXT} and len(seen) == 72
    finally:
        jq.close()


def test_a_character_the_database_cannot_hold_is_refused_and_nothing_written(latin1_url):
    jq = JobQueue(latin1_url, **FAST)
    jq.migrate()
    try:
        with pytest.raises(DataRejected, match="LATIN1"):
            jq.enqueue("enc.echo", {"s": "emoji 😀"})
        with pytest.raises(DataRejected, match="LATIN1"):
            jq.enqueue_many([("enc.echo", {"s": TEXT})] * 69 + [("enc.echo", {"s": "😀"})])
        assert jq.list_jobs(limit=10) == []
    finally:
        jq.close()


def test_a_failure_whose_text_the_database_cannot_hold_still_ends_the_job(latin1_url):
    # The last-resort failure write kept the error's text as the dead
    # reason, which the database refused too: the job stayed held, and a
    # burst worker left it unwritten.
    jq = JobQueue(latin1_url, **FAST)

    @jq.task(name="enc.boom", max_attempts=1)
    def boom() -> None:
        raise ValueError("bad 😀 thing")

    jq.migrate()
    try:
        job = jq.enqueue("enc.boom")
        jq.run_worker(burst=True)
        (dead,) = wait_status(jq, [job.id], {JobStatus.DEAD})
        assert dead.dead_reason is not None and "bad \\U0001f600 thing" in dead.dead_reason
    finally:
        jq.close()


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_result_the_database_cannot_hold_sends_the_job_to_the_dead_letters(
    latin1_url, max_attempts
):
    # The completer made such a job retryable whatever its max_attempts: a
    # max_attempts=1 task ran twice, and every retry ran the task's side
    # effects again to the same refused result. A result the encoder
    # refuses goes to the dead letters at once; one the database refuses
    # now does too.
    jq = JobQueue(latin1_url, **FAST)
    runs: list[int] = []

    @jq.task(name="enc.smile", max_attempts=max_attempts)
    def smile() -> str:
        runs.append(1)
        return "😀"

    jq.migrate()
    try:
        job = jq.enqueue("enc.smile")
        jq.run_worker(burst=True)
        (dead,) = wait_status(jq, [job.id], {JobStatus.DEAD})
        assert len(runs) == 1 and dead.attempt == 1
        assert "result not storable" in dead.errors[0]["error"]
        assert dead.dead_reason is not None and "result not storable" in dead.dead_reason
        assert "fix what it returns" in dead.dead_reason
    finally:
        jq.close()


def test_doctor_warns_about_a_database_not_in_utf8(latin1_url, pg_url):
    jq = JobQueue(latin1_url, **FAST)
    jq.migrate()
    utf8 = JobQueue(pg_url, **FAST)
    utf8.migrate()
    try:
        check = {c.name: c for c in run_checks(jq)}["encoding"]
        assert check.level == "warn" and "LATIN1" in check.message, check
        assert "DataRejected" in check.message
        check = {c.name: c for c in run_checks(utf8)}["encoding"]
        assert (check.level, check.message) == ("ok", "UTF8")
    finally:
        jq.close()
        utf8.close()


def test_doctor_says_a_sql_ascii_database_checks_nothing(sql_ascii_url):
    # SQL_ASCII refuses nothing (the server stores bytes unchecked): the
    # LATIN1 wording ("... are refused") would be wrong for it.
    jq = JobQueue(sql_ascii_url, **FAST)
    jq.migrate()
    try:
        check = {c.name: c for c in run_checks(jq)}["encoding"]
        assert check.level == "warn" and "neither checks nor converts" in check.message, check
        assert "refused" not in check.message
    finally:
        jq.close()
