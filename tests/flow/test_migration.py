"""Migrations on a database in use: 0007 keeps jobs, dead letters and worker
rows, and workers registered before it show no version; 0014 runs beside a
claim in flight."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from jobkeeper import JobQueue
from support.db import migrate_to, sql
from support.waiting import wait_for


def test_0007_upgrades_a_database_in_use(db_url, monkeypatch):
    with JobQueue(db_url) as jq:
        migrate_to(jq, 6, monkeypatch)
        # Rows written by the code of that version (raw SQL: this code
        # writes the new columns).
        sql(
            db_url,
            "INSERT INTO jobkeeper_jobs (queue, task, args) VALUES ('q', 't', ?)",
            ['{"keep": 1}'],
        )
        job_id = int(sql(db_url, "SELECT max(id) FROM jobkeeper_jobs")[0][0])
        sql(
            db_url,
            "INSERT INTO jobkeeper_workers (id, hostname, pid, queues, started_at, "
            "heartbeat_at) VALUES ('old', 'h', 1, '[]', "
            + ("now(), now())" if db_url.startswith("postgres") else "0, 0)"),
        )
        assert jq.migrate() == jq.backend.schema_expected() >= 7
        assert jq.get_job(job_id).args == {"keep": 1}
        assert jq.get_job(job_id).serial_key is None
        assert [(w.id, w.version) for w in jq.workers()] == [("old", None)]
        with pytest.warns(UserWarning, match="old \\(no version\\)"):
            jq.configure_queue("q", concurrency=1)
        assert len(jq.backend.job_claim(worker_id="w", queue="q", limit=5)) == 1


RETIRED_INDEX = "SELECT to_regclass('jobkeeper_jobs_serial_first_idx') IS NOT NULL"


def test_0014_migrates_beside_a_claim_that_read_the_table_and_then_writes(
    pg_url, monkeypatch, caplog
):
    """A claim in flight holds ACCESS SHARE on the jobs table from its reads
    and then asks for ROW EXCLUSIVE to update. Migration 14, which dropped
    version 13's index after building its own in migrate's one transaction,
    deadlocked with it: it held the build's SHARE lock (the claim's update
    waits behind it) and waited for ACCESS EXCLUSIVE behind the claim's
    reads (helper-61: 12 of 12 migrates lost against busy or idle workers).
    The old index is now dropped concurrently once the transaction commits:
    that waits for the claim to finish, and blocks nothing.
    """
    with JobQueue(pg_url) as jq:
        migrate_to(jq, 13, monkeypatch)
        # Version 13's index, which migrate drops after version 14 commits.
        assert sql(pg_url, RETIRED_INDEX) == [(True,)]
        # As version 13's code enqueues a keyed job (this code writes columns
        # of later versions).
        sql(pg_url, "INSERT INTO jobkeeper_queues (name, serial) VALUES ('default', true)")
        job_id = sql(
            pg_url,
            "INSERT INTO jobkeeper_jobs (queue, task, args, serial_key) "
            "VALUES ('default', 't', '{}', 'k') RETURNING id",
        )[0][0]
        with psycopg.connect(pg_url) as claim:
            claim.execute("SELECT count(*) FROM jobkeeper_jobs").fetchone()
            migrated: list[int] = []
            migrating = threading.Thread(target=lambda: migrated.append(jq.migrate()))
            migrating.start()
            # The migrate takes its locks, or waits for them, meanwhile.
            migrating.join(timeout=1.0)
            claim.execute("UPDATE jobkeeper_jobs SET priority = priority WHERE id = %s", (job_id,))
            claim.commit()
            migrating.join(timeout=30)
        assert migrated == [jq.backend.schema_expected()]
        assert sql(pg_url, RETIRED_INDEX) == [(False,)]
    # The drop, which may wait on others' transactions, said so once.
    dropping = [r.getMessage() for r in caplog.records if "concurrently" in r.getMessage()]
    assert dropping == [
        "dropping index jobkeeper_jobs_serial_first_idx (replaced in schema version 14) "
        "concurrently: this waits for the transactions open on jobkeeper_jobs to end"
    ]
    with JobQueue(pg_url) as jq:
        caplog.clear()
        jq.migrate()  # nothing left to drop: nothing said
        assert not [r for r in caplog.records if "concurrently" in r.getMessage()]
        assert [j.id for j in jq.backend.job_claim(worker_id="w", queue="default", limit=5)] == [
            job_id
        ]


def test_a_new_schema_drops_the_retired_index_without_a_warning(pg_url, caplog):
    # Version 13 makes the index and migrate drops it again: on a schema this
    # call created there is nothing to wait for, so nothing to warn about.
    with JobQueue(pg_url) as jq:
        assert jq.migrate() == jq.backend.schema_expected()
    assert sql(pg_url, RETIRED_INDEX) == [(False,)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_claim_in_flight_while_a_column_is_added_claims_again(pg_url):
    """helper-71: a worker's claim of a queue with settings, planned before a
    migration added a column to the jobs table and run after it committed,
    failed ("structure of query does not match function result type") and
    the worker logged it as an ERROR. The backend claims again instead."""
    with JobQueue(pg_url) as jq:
        jq.migrate()
        jq.configure_queue("q", concurrency=5)
        jobs = jq.enqueue_many([("t", {}, {"queue": "q"})] * 3)
        claimed: list[object] = []
        with psycopg.connect(pg_url) as holder, psycopg.connect(pg_url) as migration:
            # The claim function's first step waits for the queue's row.
            holder.execute("SELECT 1 FROM jobkeeper_queues WHERE name = 'q' FOR UPDATE")
            claiming = threading.Thread(
                target=lambda: claimed.append(
                    jq.backend.job_claim(worker_id="w", queue="q", limit=5)
                )
            )
            claiming.start()
            waiting = (
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE '%%jobkeeper_claim_limited%%'"
            )
            wait_for(lambda: sql(pg_url, waiting)[0][0], what="the claim to wait for the row")
            migration.execute("ALTER TABLE jobkeeper_jobs ADD COLUMN added_later integer")
            migration.commit()
            holder.commit()
            claiming.join(timeout=30)
    assert len(claimed) == 1, "the claim raised (see the thread's exception)"
    assert {job.id for job in claimed[0]} == {job.id for job in jobs}
