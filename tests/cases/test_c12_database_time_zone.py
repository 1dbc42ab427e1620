"""C-12: a database session time zone other than UTC delays every job by the
offset (caveman#37, proletarian).

PostgreSQL: a database of our own whose default zone is ``Europe/Paris``
or ``Pacific/Kiritimati`` (UTC+14), set with ALTER DATABASE (never on the
shared ``test`` database). The schema is migrated under that zone; every
timestamp column is ``timestamptz``; an immediate job, one enqueued in the
caller's transaction and one inserted by plain SQL relying on the column
defaults run at once under a real worker, one with a 2 s delay runs after
2 s (not an hour or 14 later), one with 60 s waits 60 s. Sessions set to
other zones change nothing either. SQLite (and PostgreSQL): an enqueuer and
a worker running in a far local zone; SQLite stores Unix seconds, UTC by
construction.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from backends.helpers import claim, current_schema, with_pg_options
from jobkeeper import JobQueue, JobStatus
from support.db import PG_URL, is_pg, job, pg_database_url, sql
from support.settings import FAST
from support.waiting import wait_status
from worker.helpers import running

SECOND = timedelta(seconds=1)
#: How late a due job may start under a real worker polling every 50 ms on a
#: loaded machine; any zone mix-up is off by an hour or more.
SLACK = timedelta(seconds=10)


@pytest.fixture(params=["Europe/Paris", "Pacific/Kiritimati"])
def zoned_database(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A database of our own whose sessions default to a far time zone."""
    zone = request.param
    name = f"jk_c12_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(f"ALTER DATABASE \"{name}\" SET timezone = '{zone}'")
    try:
        yield pg_database_url(name), zone
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_c12_database_time_zone_does_not_shift_jobs(zoned_database):
    url, zone = zoned_database
    with JobQueue(url, **FAST) as jq:
        assert sql(jq, "SHOW timezone")[0][0] == zone  # every new session's zone
        jq.migrate()  # under that zone too
        naive = sql(
            jq,
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name LIKE 'jobkeeper_%%' "
            "AND data_type LIKE 'timestamp%%' AND data_type <> 'timestamp with time zone'",
        )
        assert naive == []
        ran: dict[str, datetime] = {}

        @jq.task
        def t(when: str) -> None:
            ran[when] = jq.backend.db_now()

        db_now = jq.backend.db_now()
        assert abs(db_now - datetime.now(UTC)) < timedelta(minutes=5)  # same host
        now_job = t.enqueue(when="now")
        soon = t.options(delay=2).enqueue(when="soon")
        later = t.options(delay=60).enqueue(when="later")
        with psycopg.connect(url) as conn:  # the caller's session, in the database's zone
            in_tx = jq.enqueue("t", {"when": "tx"}, connection=conn)
            conn.commit()
        # Plain SQL relying on the column defaults (jobkeeper documents no SQL
        # enqueue; this is the way a tool outside it would write a job).
        sql(
            jq,
            "INSERT INTO jobkeeper_jobs (queue, task, args) VALUES ('default', 't', ?::jsonb)",
            ('{"when": "sql"}',),
        )
        (by_sql,) = [j for j in jq.list_jobs() if j.args == {"when": "sql"}]
        for j in (now_job, in_tx, by_sql):
            assert j.status == JobStatus.AVAILABLE
            assert abs(j.scheduled_at - db_now) < 5 * SECOND
            assert abs(j.created_at - db_now) < 5 * SECOND
        assert abs(soon.scheduled_at - soon.created_at - 2 * SECOND) < 0.5 * SECOND
        assert abs(later.scheduled_at - later.created_at - 60 * SECOND) < 0.5 * SECOND
        with running(jq.worker(concurrency=4)):
            wait_status(jq, [now_job.id, in_tx.id, by_sql.id, soon.id], {JobStatus.COMPLETED})
            assert 55 < (jq.backend.job_next_due_in(queues=["default"]) or 0) <= 60
        for when, queued in (("now", now_job), ("tx", in_tx), ("sql", by_sql)):
            assert ran[when] - queued.created_at < SLACK, when
        assert soon.scheduled_at <= ran["soon"] < soon.scheduled_at + SLACK
        assert "later" not in ran
        assert job(jq, later.id).status == JobStatus.SCHEDULED
        # Read back through a UTC session: the same instants.
        with JobQueue(with_pg_options(url, "-ctimezone=UTC")) as utc:
            assert sql(utc, "SHOW timezone")[0][0] == "UTC"
            for queued in (later, soon):
                stored = utc.get_job(queued.id)
                assert stored is not None and stored.scheduled_at == queued.scheduled_at


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Europe/Paris", "America/Adak"])
def test_c12_postgres_session_time_zone_does_not_shift_jobs(pg_url, zone):
    with JobQueue(pg_url) as base:
        base.migrate()
        schema = current_schema(base)
    url = with_pg_options(pg_url, f"-ctimezone={zone}")
    with JobQueue(url) as jq:
        assert current_schema(jq) == schema
        assert sql(jq, "SHOW timezone")[0][0] == zone
        db_now = jq.backend.db_now()
        wall = datetime.now(UTC)
        assert abs(db_now - wall) < timedelta(minutes=5)  # same host: no hours-long offset
        now_job = jq.enqueue("t", {"when": "now"})
        later = jq.enqueue("t", {"when": "later"}, delay=60)
        assert now_job.status == JobStatus.AVAILABLE
        assert later.status == JobStatus.SCHEDULED
        assert abs(now_job.scheduled_at - db_now) < 5 * SECOND
        assert abs(later.scheduled_at - (db_now + timedelta(seconds=60))) < 5 * SECOND
        assert later.scheduled_at.utcoffset() == timedelta(0)
        # The immediate job is claimable at once; the delayed one is not due.
        assert jq.backend.job_stage_due().staged == 0
        assert [j.id for j in claim(jq)] == [now_job.id]
        assert 55 < (jq.backend.job_next_due_in(queues=["default"]) or 0) <= 60
        # A job enqueued inside a caller's transaction with yet another zone.
        with psycopg.connect(pg_url) as conn:
            conn.execute("SET TIME ZONE 'Asia/Kathmandu'")
            in_tx = jq.enqueue("t", {"when": "tx"}, delay=60, connection=conn)
            conn.commit()
        assert abs(in_tx.scheduled_at - (db_now + timedelta(seconds=60))) < 5 * SECOND
    # Read back through a UTC session: the same instants.
    with JobQueue(pg_url) as utc:
        stored = utc.get_job(later.id)
        assert stored is not None and stored.scheduled_at == later.scheduled_at


PROCESS_SCRIPT = """
import json, sys, threading, time
from datetime import datetime
from jobkeeper import JobQueue

jq = JobQueue(sys.argv[1], heartbeat_interval=0.1, rescue_after=1.0, poll_interval=0.05)
jq.migrate()

@jq.task
def t(when: str) -> str:
    return when

now = jq.enqueue("t", {"when": "now"})
soon = jq.enqueue("t", {"when": "soon"}, delay=2)
later = jq.enqueue("t", {"when": "later"}, delay=60)
worker = jq.worker()
thread = threading.Thread(target=worker.run)
thread.start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline and any(
        jq.get_job(j.id).status != "completed" for j in (now, soon)):
    time.sleep(0.05)
worker.stop()
thread.join(60)
print(json.dumps({"offset": datetime.now().astimezone().utcoffset().total_seconds(),
                  "ids": [now.id, soon.id, later.id]}))
"""


@pytest.mark.parametrize("tz", ["Pacific/Kiritimati", "Pacific/Pago_Pago"])
def test_c12_enqueuer_and_worker_in_a_far_local_zone(make_queue, tz):
    jq = make_queue()
    done = subprocess.run(
        [sys.executable, "-c", PROCESS_SCRIPT, jq.url.url],
        env={**os.environ, "TZ": tz},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert abs(report["offset"]) >= 11 * 3600  # the child really ran far from UTC
    now_job, soon, later = (job(jq, i) for i in report["ids"])
    wall = datetime.now(UTC)
    assert abs(now_job.created_at - wall) < timedelta(minutes=2)
    assert now_job.status == soon.status == JobStatus.COMPLETED
    assert now_job.attempted_at is not None and soon.attempted_at is not None
    assert now_job.attempted_at - now_job.created_at < SLACK
    assert abs(soon.scheduled_at - soon.created_at - 2 * SECOND) < 0.5 * SECOND
    assert soon.scheduled_at <= soon.attempted_at < soon.scheduled_at + SLACK
    assert later.status == JobStatus.SCHEDULED
    assert abs(later.scheduled_at - later.created_at - 60 * SECOND) < 0.5 * SECOND
    if not is_pg(jq):
        # Unix seconds: UTC by construction, whatever zone wrote them.
        kind, stored = sql(
            jq,
            "SELECT typeof(created_at), created_at FROM jobkeeper_jobs WHERE id = ?",
            [now_job.id],
        )[0]
        assert kind == "real" and abs(stored - time.time()) < 120
