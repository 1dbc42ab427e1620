"""Enqueueing on both backends: durability, batches, transactions, unique keys,
scheduling and time zones (guarantees 1, 5, 7; run_at must be aware, and no time zone shifts a job).
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest

from jobkeeper import ConfigError, JobQueue, JobStatus, PayloadError
from support.db import PG_URL, count, is_pg, sql

from .helpers import claim, complete, kill, with_pg_options

SECOND = timedelta(seconds=1)


# -- durable enqueue --------------------------------------------------------------------


def test_enqueue_returns_a_durable_job(jq):
    job = jq.enqueue("resize", {"path": "a.png", "width": 100}, queue="images", priority=-3)
    assert job.id > 0
    assert (job.task, job.queue, job.status) == ("resize", "images", JobStatus.AVAILABLE)
    assert (job.priority, job.attempt, job.max_attempts) == (-3, 0, 20)
    assert job.args == {"path": "a.png", "width": 100}
    assert job.errors == []
    assert job.result is None and job.worker_id is None and job.finished_at is None
    assert job.scheduled_at.utcoffset() == timedelta(0)
    assert job.created_at.utcoffset() == timedelta(0)
    # A new JobQueue (new connections) on the same URL reads the same job.
    with JobQueue(jq.url.url) as other:
        stored = other.get_job(job.id)
    assert stored is not None
    assert stored.to_dict() == job.to_dict()


def test_ids_increase_in_enqueue_order(jq):
    ids = [jq.enqueue("t", {"i": i}).id for i in range(5)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5


def test_enqueue_through_a_registered_task_uses_its_defaults(jq):
    @jq.task(queue="emails", max_attempts=3, priority=7)
    def send(to: str) -> None: ...

    job = send.enqueue(to="a@example.com")
    assert (job.task, job.queue, job.max_attempts, job.priority) == ("send", "emails", 3, 7)
    job = send.options(priority=-1, queue="urgent", max_attempts=9).enqueue(to="b@example.com")
    assert (job.queue, job.max_attempts, job.priority) == ("urgent", 9, -1)
    assert jq.enqueue(send, {"to": "c"}).task == "send"


def test_enqueue_on_an_unmigrated_database_says_to_migrate(db_url):
    with JobQueue(db_url) as fresh, pytest.raises(Exception, match="migrate") as info:
        fresh.enqueue("t", {})
    assert type(info.value).__name__ == "DatabaseError"


# -- enqueue_many ---------------------------------------------------------------------------


def test_enqueue_many_returns_jobs_in_input_order(jq):
    items = [("task_b", {"i": 0}), ("task_a", {"i": 1}, {"queue": "q2"}), ("task_c", {"i": 2})]
    items += [("task_a", {"i": i}, {"priority": -i}) for i in range(3, 10)]
    jobs = jq.enqueue_many(items)
    assert [job.args for job in jobs] == [{"i": i} for i in range(10)]
    assert [job.task for job in jobs][:3] == ["task_b", "task_a", "task_c"]
    assert jobs[1].queue == "q2"
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    assert count(jq) == 10
    assert jq.enqueue_many([]) == []


@pytest.mark.parametrize(
    ("bad", "error", "needle"),
    [
        ({"x": float("nan")}, PayloadError, r"jobs\[6\]: args\.x: nan"),
        ({"s": "a\x00b"}, PayloadError, r"jobs\[6\]: args\.s: .*NUL"),
        ({"t": (1,)}, PayloadError, r"jobs\[6\]: args\.t: .*tuple"),
    ],
)
def test_enqueue_many_is_all_or_nothing(jq, bad, error, needle):
    items = [("t", {"i": i}) for i in range(10)]
    items[6] = ("t", bad)
    with pytest.raises(error, match=needle):
        jq.enqueue_many(items)
    assert count(jq) == 0


def test_enqueue_many_bad_option_names_the_item_and_writes_nothing(jq):
    items = [("t", {"i": i}, {"delay": 5}) for i in range(10)]
    items[9] = ("t", {}, {"delay": -5})
    with pytest.raises(ConfigError, match=r"^jobs\[9\]: delay"):
        jq.enqueue_many(items)
    assert count(jq) == 0


def test_enqueue_many_is_one_transaction(jq):
    """A failure inside the write (after validation) leaves nothing behind.

    A unique index on args text makes the 3rd row's insert fail in the database.
    """
    jq.enqueue("t", {"collide": True})
    if is_pg(jq):
        sql(jq, "CREATE UNIQUE INDEX test_collide ON jobkeeper_jobs ((args->>'collide'))")
    else:
        sql(
            jq,
            "CREATE UNIQUE INDEX test_collide ON jobkeeper_jobs (json_extract(args, '$.collide'))",
        )
    with pytest.raises(Exception, match=r"(?i)unique|constraint"):
        jq.enqueue_many([("t", {"i": 1}), ("t", {"i": 2}), ("t", {"collide": True})])
    assert count(jq) == 1


# -- transactional enqueue ----------------------------------------------------------------


def open_caller_connection(jq: JobQueue):
    if is_pg(jq):
        return psycopg.connect(jq.url.url)
    return sqlite3.connect(jq.url.path, timeout=30)


def test_enqueue_with_connection_commits_with_the_caller(jq):
    conn = open_caller_connection(jq)
    try:
        job = jq.enqueue("t", {"tx": "commit"}, connection=conn)
        extra = jq.enqueue_many([("t", {"n": 1}), ("t", {"n": 2})], connection=conn)
        # The caller's transaction sees its own writes; others do not yet.
        inside = conn.execute("SELECT count(*) FROM jobkeeper_jobs").fetchone()
        assert inside is not None and inside[0] == 3
        assert jq.get_job(job.id) is None
        assert count(jq) == 0
        conn.commit()
    finally:
        conn.close()
    stored = jq.get_job(job.id)
    assert stored is not None
    assert (stored.status, stored.args) == (JobStatus.AVAILABLE, {"tx": "commit"})
    assert [jq.get_job(j.id) is not None for j in extra] == [True, True]
    assert claim(jq)[0].id == job.id


def test_enqueue_with_connection_rolls_back_with_the_caller(jq):
    conn = open_caller_connection(jq)
    try:
        job = jq.enqueue("t", {"tx": "rollback"}, connection=conn)
        jq.enqueue_many([("t", {"n": 1})], connection=conn)
        conn.rollback()
    finally:
        conn.close()
    assert jq.get_job(job.id) is None
    assert count(jq) == 0
    assert claim(jq) == []


def test_enqueue_with_connection_of_the_wrong_kind_is_a_type_error(jq, tmp_path):
    # Closed by the test: Python 3.13 warns (an error here) for an unclosed one.
    with contextlib.closing(sqlite3.connect(":memory:")) as memory_db:
        wrong = memory_db if is_pg(jq) else object()
        with pytest.raises(TypeError, match="connection="):
            jq.enqueue("t", {}, connection=wrong)
    if not is_pg(jq):
        other = sqlite3.connect(tmp_path / "other.db")
        memory = sqlite3.connect(":memory:")
        try:
            with pytest.raises(TypeError, match="not on this queue's database"):
                jq.enqueue("t", {}, connection=other)
            with pytest.raises(TypeError, match="in-memory"):
                jq.enqueue_many([("t", {})], connection=memory)
        finally:
            other.close()
            memory.close()
        with (
            psycopg.connect(PG_URL) as pg_conn,
            pytest.raises(TypeError, match=r"sqlite3\.Connection"),
        ):
            jq.enqueue("t", {}, connection=pg_conn)
    assert count(jq) == 0


def test_invalid_args_with_connection_write_nothing_to_the_caller(jq):
    conn = open_caller_connection(jq)
    try:
        with pytest.raises(PayloadError):
            jq.enqueue("t", {"x": float("inf")}, connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert count(jq) == 0


# -- unique_key ------------------------------------------------------------------------


def test_unique_key_returns_the_pending_job(jq):
    first = jq.enqueue("resize", {"v": 1}, unique_key="a.png")
    second = jq.enqueue("resize", {"v": 2}, unique_key="a.png", priority=5)
    assert second.id == first.id
    assert second.args == {"v": 1}
    assert count(jq) == 1
    # Held (claimed, then running) still counts as pending.
    (running,) = claim(jq)
    third = jq.enqueue("resize", {"v": 3}, unique_key="a.png")
    assert third.id == first.id
    assert third.status == JobStatus.CLAIMED
    # Once completed, the key is free again.
    assert complete(jq, running) == {first.id}
    fourth = jq.enqueue("resize", {"v": 4}, unique_key="a.png")
    assert fourth.id != first.id
    assert fourth.status == JobStatus.AVAILABLE
    assert count(jq) == 2


def test_unique_key_is_freed_by_cancel_and_dead(jq):
    first = jq.enqueue("t", {}, unique_key="k")
    jq.cancel(first.id)
    second = jq.enqueue("t", {}, unique_key="k")
    assert second.id != first.id
    kill(jq, second)
    third = jq.enqueue("t", {}, unique_key="k")
    assert third.id not in (first.id, second.id)


def test_unique_key_scheduled_job_counts_as_pending(jq):
    first = jq.enqueue("t", {}, unique_key="later", delay=3600)
    assert first.status == JobStatus.SCHEDULED
    assert jq.enqueue("t", {}, unique_key="later").id == first.id


def test_unique_keys_are_scoped_per_task(jq):
    a = jq.enqueue("task_a", {}, unique_key="same")
    b = jq.enqueue("task_b", {}, unique_key="same")
    assert a.id != b.id
    assert count(jq) == 2


def test_enqueue_many_with_duplicate_keys_in_one_batch(jq):
    pending = jq.enqueue("t", {"old": True}, unique_key="held")
    jobs = jq.enqueue_many(
        [
            ("t", {"n": 0}, {"unique_key": "k1"}),
            ("t", {"n": 1}, {"unique_key": "k1"}),
            ("t", {"n": 2}),
            ("other", {"n": 3}, {"unique_key": "k1"}),
            ("t", {"n": 4}, {"unique_key": "held"}),
            ("t", {"n": 5}, {"unique_key": "k2"}),
            ("t", {"n": 6}, {"unique_key": "k1"}),
        ]
    )
    assert len(jobs) == 7
    assert jobs[0].id == jobs[1].id == jobs[6].id
    assert jobs[0].args == {"n": 0}
    assert jobs[3].id != jobs[0].id and jobs[3].task == "other"
    assert jobs[4].id == pending.id and jobs[4].args == {"old": True}
    assert jobs[2].args == {"n": 2} and jobs[5].args == {"n": 5}
    assert len({j.id for j in jobs}) == 5
    assert count(jq) == 5


def test_retry_refuses_when_the_unique_key_is_held_again(jq):
    first = jq.enqueue("t", {}, unique_key="k")
    kill(jq, first)
    holder = jq.enqueue("t", {}, unique_key="k")
    from jobkeeper import JobStateError

    with pytest.raises(JobStateError, match="unique_key"):
        jq.retry(first.id)
    with pytest.raises(JobStateError, match="unique_key"):
        jq.requeue_dead([first.id])
    after = jq.get_job(first.id)
    assert after is not None and after.status == JobStatus.DEAD
    assert jq.get_job(holder.id) is not None
    assert count(jq, "jobkeeper_dead_letters") == 1


def test_a_refused_requeue_names_the_dead_letters_in_the_way(jq):
    # It said only that "a pending job" held "the unique_key of a dead
    # letter": with --all there was no telling which.
    from jobkeeper import JobStateError

    held = kill(jq, jq.enqueue("t", {}, unique_key="k1"))
    holder = jq.enqueue("t", {}, unique_key="k1")
    twin_a = kill(jq, jq.enqueue("u", {}, unique_key="k2"))
    twin_b = kill(jq, jq.enqueue("u", {}, unique_key="k2"))
    free = kill(jq, jq.enqueue("t", {}, unique_key="k3"))
    with pytest.raises(JobStateError) as info:
        jq.requeue_dead()
    message = str(info.value)
    assert (
        f"dead letter {held.id} (task 't', unique_key 'k1') is held by pending job {holder.id}"
        in message
    )
    assert (
        f"dead letter {twin_b.id} (task 'u', unique_key 'k2') clashes with dead letter {twin_a.id}"
        in message
    )
    assert message.endswith("; nothing was requeued")
    assert str(free.id) not in message
    assert count(jq, "jobkeeper_dead_letters") == 4


# -- scheduling ---------------------------------------------------------------------------------


def test_delay_makes_a_scheduled_job_that_is_staged_only_when_due(jq):
    now = jq.backend.db_now()
    later = jq.enqueue("t", {}, delay=3600)
    soon = jq.enqueue("t", {}, delay=0.2)
    assert later.status == soon.status == JobStatus.SCHEDULED
    assert abs(later.scheduled_at - (now + timedelta(hours=1))) < 5 * SECOND
    assert claim(jq) == []
    # Wait on the database clock (not on our own) until `soon` is due.
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    while jq.backend.db_now() < soon.scheduled_at:
        assert datetime.now(UTC) < deadline
        time.sleep(0.02)
    assert jq.backend.job_stage_due().staged == 1
    staged = jq.get_job(soon.id)
    assert staged is not None and staged.status == JobStatus.AVAILABLE
    still = jq.get_job(later.id)
    assert still is not None and still.status == JobStatus.SCHEDULED
    assert [j.id for j in claim(jq)] == [soon.id]


def test_zero_delay_is_available_at_once(jq):
    assert jq.enqueue("t", {}, delay=0).status == JobStatus.AVAILABLE


@pytest.mark.parametrize(
    "zone", [ZoneInfo("Asia/Tokyo"), ZoneInfo("America/Los_Angeles"), timezone(timedelta(hours=14))]
)
def test_aware_run_at_in_another_zone_is_stored_as_utc(jq, zone):
    run_at = (datetime.now(UTC) + timedelta(minutes=10)).astimezone(zone)
    job = jq.enqueue("t", {}, run_at=run_at)
    assert job.status == JobStatus.SCHEDULED
    assert job.scheduled_at.utcoffset() == timedelta(0)
    assert abs(job.scheduled_at - run_at) < timedelta(milliseconds=1)
    stored = jq.get_job(job.id)
    assert stored is not None and abs(stored.scheduled_at - run_at) < timedelta(milliseconds=1)
    assert jq.backend.job_stage_due().staged == 0
    assert claim(jq) == []


def test_past_run_at_is_available_now(jq):
    past = datetime.now(ZoneInfo("Asia/Tokyo")) - timedelta(hours=3)
    job = jq.enqueue("t", {}, run_at=past)
    assert job.status == JobStatus.AVAILABLE
    assert [j.id for j in claim(jq)] == [job.id]


def test_naive_run_at_writes_nothing(jq):
    with pytest.raises(ConfigError, match="naive"):
        jq.enqueue("t", {}, run_at=datetime.now() + timedelta(minutes=10))
    assert count(jq) == 0


@pytest.mark.parametrize("delay", [-1, -0.5, float("nan"), float("inf")])
def test_negative_or_nan_delay_writes_nothing(jq, delay):
    with pytest.raises(ConfigError, match="delay"):
        jq.enqueue("t", {}, delay=delay)
    assert count(jq) == 0


# -- bulk inserts: what enqueue_many returns is what was stored -------------------------------


def mixed_batch(size: int) -> list[tuple[str, dict[str, object], dict[str, object]]]:
    now = datetime.now(UTC)
    zones = [UTC, ZoneInfo("Asia/Tokyo"), ZoneInfo("America/Los_Angeles")]
    items: list[tuple[str, dict[str, object], dict[str, object]]] = []
    for i in range(size):
        options: dict[str, object] = {"priority": i % 7 - 3, "queue": f"q{i % 3}"}
        if i % 5 == 1:
            options["delay"] = 0.1234567 * i + 30
        elif i % 5 == 2:
            options["run_at"] = (now + timedelta(minutes=i, microseconds=i)).astimezone(
                zones[i % 3]
            )
        elif i % 5 == 3:
            options["run_at"] = (now - timedelta(minutes=i)).astimezone(zones[i % 3])
        if i % 11 == 0:
            options["max_attempts"] = 1 + i
        items.append((f"task_{i % 4}", {"i": i, "s": "é" * (i % 3), "l": [i, None]}, options))
    return items


@pytest.mark.parametrize("size", [2, 63, 64, 300])
def test_enqueue_many_returns_exactly_what_is_stored(jq, size):
    jobs = jq.enqueue_many(mixed_batch(size))
    assert len(jobs) == size
    assert [j.args["i"] for j in jobs] == list(range(size))  # type: ignore[index]
    ids = [j.id for j in jobs]
    assert ids == sorted(ids) and len(set(ids)) == size
    for job in jobs:
        stored = jq.get_job(job.id)
        assert stored is not None
        assert stored.to_dict() == job.to_dict()
    statuses = {j.status for j in jobs}
    assert statuses == {JobStatus.AVAILABLE, JobStatus.SCHEDULED}
    assert count(jq) == size


def test_bulk_enqueue_is_one_transaction(jq):
    """The bulk path (many jobs, no unique keys) also writes all or nothing."""
    jq.enqueue("t", {"collide": True})
    if is_pg(jq):
        sql(jq, "CREATE UNIQUE INDEX test_collide ON jobkeeper_jobs ((args->>'collide'))")
    else:
        sql(
            jq,
            "CREATE UNIQUE INDEX test_collide ON jobkeeper_jobs (json_extract(args, '$.collide'))",
        )
    items = [("t", {"i": i}) for i in range(200)]
    items[150] = ("t", {"collide": True})
    with pytest.raises(Exception, match=r"(?i)unique|constraint"):
        jq.enqueue_many(items)
    assert count(jq) == 1
    # The failed batch left nothing that shifts ids: the next batch is consistent.
    jobs = jq.enqueue_many([("t", {"i": i}) for i in range(100)])
    for job in jobs[::17]:
        stored = jq.get_job(job.id)
        assert stored is not None and stored.args == job.args


def test_bulk_enqueue_interleaved_with_other_writers_keeps_ids_right(jq):
    """Concurrent batches from several threads: every returned id holds its own args."""
    results: list[list] = []
    errors: list[BaseException] = []

    def enqueue(worker: int) -> None:
        try:
            for round_ in range(3):
                batch = [("t", {"w": worker, "r": round_, "i": i}) for i in range(80)]
                results.append(jq.enqueue_many(batch))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    returned = [job for batch in results for job in batch]
    assert len(returned) == 4 * 3 * 80
    assert len({job.id for job in returned}) == len(returned)
    stored = {job.id: job.args for job in jq.list_jobs(limit=10_000)}
    assert all(stored[job.id] == job.args for job in returned)


def test_failed_batch_in_the_callers_transaction_leaves_none_of_its_rows(jq):
    """A database error mid-batch (here a unique index hit by the 150th row)
    must not leave the first 149 rows in the caller's transaction."""
    jq.enqueue("t", {"collide": True})
    if is_pg(jq):
        sql(jq, "CREATE UNIQUE INDEX test_collide ON jobkeeper_jobs ((args->>'collide'))")
    else:
        sql(
            jq,
            "CREATE UNIQUE INDEX test_collide ON jobkeeper_jobs (json_extract(args, '$.collide'))",
        )
    sql(jq, "CREATE TABLE app_orders (n integer)")
    items = [("t", {"i": i}) for i in range(200)]
    items[150] = ("t", {"collide": True})
    conn = open_caller_connection(jq)
    try:
        conn.execute("INSERT INTO app_orders VALUES (1)")
        kept = jq.enqueue("t", {"before": True}, connection=conn)
        with pytest.raises(Exception, match=r"(?i)unique|constraint"):
            jq.enqueue_many(items, connection=conn)
        with pytest.raises(Exception, match=r"(?i)unique|constraint"):
            jq.enqueue_many(items[140:160], connection=conn)  # the per-row path too
        # The failed batch rolled back to its own savepoint: the caller's
        # transaction is still usable on both backends.
        conn.commit()
    finally:
        conn.close()
    assert (
        count(jq, where="args LIKE '%\"i\"%'" if not is_pg(jq) else "args->>'i' IS NOT NULL") == 0
    )
    # The caller's own work and its earlier enqueue survive the failed batch.
    assert count(jq, "app_orders") == 1
    assert jq.get_job(kept.id) is not None
    assert count(jq) == 2


def test_sqlite_autocommit_connection_batch_is_atomic_with_right_ids(sqlite_url):
    """On an autocommit connection another writer must not get between the
    rows of one batch (the returned ids would point at other jobs). Each row's
    INSERT is traced, and the trace hook tries to slip a row in right there.
    """
    with JobQueue(sqlite_url) as jq:
        jq.migrate()
        conn = sqlite3.connect(jq.url.path, isolation_level=None)
        intruder = sqlite3.connect(jq.url.path, isolation_level=None, timeout=0)
        tries = []

        def slip_a_row_in(statement: str) -> None:
            if "INSERT INTO JOBKEEPER_JOBS" in " ".join(statement.upper().split()):
                tries.append(statement)
                # Locked out (OperationalError) while the batch holds the write lock.
                with contextlib.suppress(sqlite3.OperationalError):
                    intruder.execute(
                        "INSERT INTO jobkeeper_jobs (queue, task) VALUES ('default', 'intruder')"
                    )

        conn.set_trace_callback(slip_a_row_in)
        try:
            returned = jq.enqueue_many([("mine", {"i": i}) for i in range(10)], connection=conn)
        finally:
            conn.close()
            intruder.close()
        assert len(tries) == 10
        stored = {job.id: job.args for job in jq.list_jobs(limit=100)}
        assert [stored.get(job.id) for job in returned] == [{"i": i} for i in range(10)]


def test_run_at_far_ahead_or_back_is_stored_and_read_back(jq):
    now = datetime.now(UTC)
    far = jq.enqueue("t", {}, run_at=now + timedelta(days=99 * 365))
    ancient = jq.enqueue("t", {}, run_at=now - timedelta(days=99 * 365))
    assert far.status == JobStatus.SCHEDULED
    assert ancient.status == JobStatus.AVAILABLE
    stored_far, stored_ancient = jq.get_job(far.id), jq.get_job(ancient.id)
    assert stored_far is not None and stored_far.scheduled_at == far.scheduled_at
    assert stored_ancient is not None and stored_ancient.scheduled_at == ancient.scheduled_at
    assert [j.id for j in claim(jq)] == [ancient.id]
    assert jq.backend.job_stage_due().staged == 0
    assert jq.stats()["default"]["scheduled"] == 1


@pytest.mark.parametrize("year", [1, 1900, 2200, 9999])
def test_run_at_more_than_a_hundred_years_away_is_refused(jq, year):
    # Found by a break-test: delay was capped at 100 years but run_at took
    # years 1 and 9999, and a year-1 job made the queue's latency 6.4e10 s.
    when = datetime(year, 6, 1, tzinfo=UTC)
    # Said as it is: a far-past run_at was "more than 100 years from now".
    away = "from now" if year > 2000 else "ago"
    with pytest.raises(ConfigError, match=rf"run_at=.* is more than 100 years {away} "):
        jq.enqueue("t", {}, run_at=when)
    with pytest.raises(ConfigError, match="run_at"):
        jq.enqueue_many([("t", {}), ("t", {}, {"run_at": when})])
    assert jq.stats() == {}


def test_pg_connection_to_another_schema_is_refused(pg_url):
    """connection= must reach the queue's own tables: a connection whose
    search_path is another schema would write the job somewhere no worker looks."""
    with JobQueue(pg_url) as jq:
        jq.migrate()
        with psycopg.connect(PG_URL) as other, pytest.raises(TypeError, match="schema"):
            jq.enqueue("t", {}, connection=other)
        assert jq.stats() == {}


def test_long_schema_names_still_enqueue_and_notify():
    """A NOTIFY channel is an identifier (63 bytes): jobkeeper_<schema> for a
    60-character schema would not fit, and every enqueue would fail."""
    schema = "s" * 60
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        url = with_pg_options(PG_URL, f"-csearch_path={schema}")
        with JobQueue(url) as jq, psycopg.connect(url, autocommit=True) as listener:
            jq.migrate()
            channel = jq.backend.channel()
            assert len(channel.encode()) <= 63
            listener.execute(f'LISTEN "{channel}"')
            jq.enqueue("t", {}, queue="long-schema")
            payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
            assert payloads == ["long-schema"]
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_numbers_and_key_order_round_trip_exactly(jq):
    """What the task gets is what was enqueued: on PostgreSQL jsonb would turn
    1e16 into an int, -0.0 into 0 and sort the keys."""
    args = {"z": -0.0, "f": 1e16, "g": 1e300, "big": 2**70, "b": True, "a": [1.5, "x", None]}
    job = jq.enqueue("t", args)
    for seen in (job.args, jq.get_job(job.id).args):
        assert seen == args
        assert list(seen) == list(args)
        assert [type(v) for v in seen.values()] == [type(v) for v in args.values()]
        assert math.copysign(1.0, seen["z"]) == -1.0
