"""Every statement that inserts jobs announces them itself: one NOTIFY per
queue of its available jobs, delivered at the commit, never for what is not
committed. Schema version 12 dropped the insert trigger that did it before
(see 0012_notify_from_inserts.sql); these are the wake-ups a worker listens
for, so each insert path is heard here. PostgreSQL only: SQLite wakes
workers its own way (tests/backends/test_sqlite_wakeups.py).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from backends.helpers import claim, fail
from jobkeeper import JobStatus, PayloadError, QueueFull
from jobkeeper.maintenance.periodic import PeriodicEnqueuer
from periodic.helpers import fabricate
from support.db import count, sql
from support.notify import Listener


def heard(listener: Listener, expected: int) -> list[str]:
    """The next ``expected`` payloads, in order, once nothing more arrives."""
    listener.payloads.clear()
    got = listener.drain(until=expected, timeout=10)
    extra = [n.payload for n in listener.conn.notifies(timeout=0.3)]
    return got + extra


def plain(payloads: list[str]) -> list[str]:
    """The queue announcements among ``payloads`` (a due time has a space)."""
    return sorted(p for p in payloads if " " not in p)


def test_the_insert_trigger_is_gone_after_migrate(pg_jq):
    triggers = sql(
        pg_jq.url.url,
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'jobkeeper_jobs'::regclass"
        " AND NOT tgisinternal",
    )
    assert triggers == []
    assert pg_jq.backend.schema_version() >= 12


def test_single_enqueues_announce_their_queue(pg_jq, listener):
    pg_jq.enqueue("t", {}, queue="now")  # the one-statement path
    assert heard(listener, 1) == ["now"]
    past = datetime(2000, 1, 1, tzinfo=UTC)
    job = pg_jq.enqueue("t", {}, queue="past", run_at=past)  # due already: available
    assert job.status == JobStatus.AVAILABLE
    assert heard(listener, 1) == ["past"]
    pg_jq.enqueue("t", {}, queue="serial", serial_key="s")  # in a transaction
    assert heard(listener, 1) == ["serial"]
    pg_jq.configure_queue("limited", max_pending=10)  # the checked path
    pg_jq.enqueue("t", {}, queue="limited")
    assert heard(listener, 1) == ["limited"]
    first = pg_jq.enqueue("t", {}, queue="keyed", unique_key="k")
    assert heard(listener, 1) == ["keyed"]
    # A duplicate inserts nothing, so it announces nothing.
    assert pg_jq.enqueue("t", {}, queue="keyed", unique_key="k").id == first.id
    assert list(listener.conn.notifies(timeout=0.3)) == []
    # A delayed job is announced by its due time only.
    pg_jq.enqueue("t", {}, queue="later", delay=60)
    (due,) = heard(listener, 1)
    assert due.split(" ")[0] == "later"


def test_batches_announce_each_queue_of_their_available_jobs_once(pg_jq, listener):
    small = [("t", {}, {"queue": q}) for q in ("a", "b", "a", "b", "a")]
    pg_jq.enqueue_many(small)  # one statement over arrays
    assert sorted(heard(listener, 2)) == ["a", "b"]
    past = datetime(2000, 1, 1, tzinfo=UTC)
    copied = (
        [("t", {"i": i}, {"queue": f"c{i % 2}"}) for i in range(100)]
        + [("t", {}, {"queue": "c-later", "delay": 3600})] * 10
        + [("t", {}, {"queue": "c-past", "run_at": past})] * 5
    )
    jobs = pg_jq.enqueue_many(copied)  # the COPY path
    assert len(jobs) == 115
    payloads = heard(listener, 4)
    assert plain(payloads) == ["c-past", "c0", "c1"]
    assert [p.split(" ")[0] for p in payloads if " " in p] == ["c-later"]
    keyed = [("t", {"i": i}, {"queue": f"k{i % 2}", "unique_key": str(i)}) for i in range(80)]
    pg_jq.enqueue_many(keyed)
    assert plain(heard(listener, 2)) == ["k0", "k1"]


def test_nothing_is_announced_for_what_is_not_committed(pg_jq, listener):
    pg_jq.configure_queue("full", max_pending=1)
    pg_jq.enqueue("t", {}, queue="full")
    assert heard(listener, 1) == ["full"]
    with pytest.raises(QueueFull):
        pg_jq.enqueue("t", {}, queue="full")
    with pytest.raises(QueueFull):
        pg_jq.enqueue_many([("t", {}, {"queue": "full"})] * 100)
    # A COPY batch refused at its last item, after most rows went in.
    refused = [("t", {"i": i}, {"queue": "copied"}) for i in range(99)]
    refused.append(("t", {"x": float("nan")}, {"queue": "copied"}))
    with pytest.raises(PayloadError, match=r"jobs\[99\]"):
        pg_jq.enqueue_many(refused)
    with psycopg.connect(pg_jq.url.url) as conn:
        pg_jq.enqueue("t", {}, queue="rolled-back", connection=conn)
        pg_jq.enqueue_many([("t", {}, {"queue": "rolled-back"})] * 100, connection=conn)
        conn.rollback()
    assert list(listener.conn.notifies(timeout=0.5)) == []
    assert count(pg_jq) == 1
    # In the caller's transaction the announcement waits for its commit.
    with psycopg.connect(pg_jq.url.url) as conn:
        pg_jq.enqueue("t", {}, queue="theirs", connection=conn)
        assert list(listener.conn.notifies(timeout=0.3)) == []
        conn.commit()
    assert heard(listener, 1) == ["theirs"]


def test_requeued_dead_letters_and_periodic_ticks_are_announced(pg_jq, listener):
    dead = [pg_jq.enqueue("t", {}, queue=q, max_attempts=1) for q in ("dl1", "dl2", "dl1")]
    assert heard(listener, 3) == ["dl1", "dl2", "dl1"]
    for queue in ("dl1", "dl2"):
        for job in claim(pg_jq, queue):
            fail(pg_jq, job, "dead")
    assert pg_jq.requeue_dead() == sorted(j.id for j in dead)
    assert plain(heard(listener, 2)) == ["dl1", "dl2"]

    pg_jq.periodic(every=60, task="tick", queue="ticks")
    backend = pg_jq.backend.dedicated()
    try:
        enqueuer = PeriodicEnqueuer(backend, list(pg_jq.periodics.values()))
        now = pg_jq.backend.db_now()
        enqueuer.run_once(now=now)  # first sight: nothing owed yet
        # Owed since just before the last whole minute: that one tick is due,
        # so its job is available. (Ticks fall on multiples of 60 s since
        # the epoch: "61 s ago" took in two of them whenever now was within
        # a second past a whole minute, and the clean-clone run saw two jobs.)
        last_tick = now - timedelta(seconds=now.timestamp() % 60)
        fabricate(pg_jq.url.url, "tick", since_at=last_tick - timedelta(seconds=1))
        enqueuer.run_once(now=now)
    finally:
        backend.close()
    ticked = sql(pg_jq.url.url, "SELECT queue FROM jobkeeper_jobs WHERE task = 'tick'")
    assert [row[0] for row in ticked] == ["ticks"]
    assert heard(listener, 1) == ["ticks"]


def test_async_inserts_announce_their_queues(pg_jq, listener):
    async def enqueue() -> None:
        await pg_jq.enqueue_async("t", {}, queue="async-one")
        await pg_jq.enqueue_many_async([("t", {}, {"queue": f"async-{i % 2}"}) for i in range(100)])

    asyncio.run(enqueue())
    payloads = heard(listener, 3)
    assert payloads[0] == "async-one"
    assert sorted(payloads[1:]) == ["async-0", "async-1"]


def test_code_of_this_version_beside_the_old_trigger_is_heard_once(pg_jq, listener):
    """A database still on schema version 11 (its trigger announcing too)
    during a rolling deploy: PostgreSQL folds identical notifications of a
    transaction, so a listener hears each queue once."""
    url = pg_jq.url.url
    sql(
        url,
        """CREATE FUNCTION jobkeeper_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE queue_name text; channel text := 'jobkeeper_' || TG_TABLE_SCHEMA;
        BEGIN
            FOR queue_name IN SELECT DISTINCT queue FROM inserted WHERE status = 'available' LOOP
                PERFORM pg_notify(channel, queue_name);
            END LOOP;
            RETURN NULL;
        END $$""",
    )
    sql(
        url,
        "CREATE TRIGGER jobkeeper_jobs_notify_insert AFTER INSERT ON jobkeeper_jobs"
        " REFERENCING NEW TABLE AS inserted"
        " FOR EACH STATEMENT EXECUTE FUNCTION jobkeeper_notify_insert()",
    )
    pg_jq.enqueue("t", {}, queue="one")
    assert heard(listener, 1) == ["one"]
    pg_jq.enqueue_many([("t", {}, {"queue": f"m{i % 2}"}) for i in range(100)])
    assert sorted(heard(listener, 2)) == ["m0", "m1"]
