"""Concurrent bulk enqueues over the same unique keys.

On PostgreSQL two batches that insert the same keys in different orders each
wait in the unique index for a key the other inserted first: a deadlock,
which the server breaks by failing one of them. jobkeeper takes the keys in
one order and retries what the server asks to retry, so no call fails.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.errors import DatabaseError, DatabaseUnavailable

THREADS = 4
CALLS = 40
KEYS = [f"key-{n}" for n in range(20)]


@pytest.fixture
def pg_queue(pg_url: str) -> Iterator[JobQueue]:
    jq = JobQueue(pg_url, pool_size=THREADS)
    jq.migrate()
    yield jq
    jq.close()


def test_bulk_enqueues_over_shared_unique_keys_never_fail(pg_queue, pg_url):
    jq = pg_queue
    errors: list[BaseException] = []
    mismatches: list[str] = []
    duplicates: list[list[tuple[str, int]]] = []
    done = threading.Event()

    def enqueue_shuffled(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(CALLS):
            keys = KEYS[:]
            rng.shuffle(keys)
            try:
                jobs = jq.enqueue_many([("t", {"k": k}, {"unique_key": k}) for k in keys])
            except Exception as exc:  # counted, not raised: every failure is reported
                errors.append(exc)
                continue
            if [job.unique_key for job in jobs] != keys:
                mismatches.append(f"jobs do not follow the input order: {jobs}")

    def watch_pending() -> None:
        # At any time, at most one pending job per (task, key). And jobs
        # finish meanwhile (deleted here, as retention=0 does), freeing their
        # keys: so batches keep inserting the same keys, not only finding them.
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while not done.is_set():
                conn.execute("DELETE FROM jobkeeper_jobs WHERE status = 'available'")
                rows = conn.execute(
                    "SELECT unique_key, count(*) FROM jobkeeper_jobs "
                    "WHERE status IN ('scheduled', 'available', 'running', 'retryable') "
                    "GROUP BY task, unique_key HAVING count(*) > 1"
                ).fetchall()
                if rows:
                    duplicates.append(rows)

    watcher = threading.Thread(target=watch_pending)
    watcher.start()
    threads = [threading.Thread(target=enqueue_shuffled, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()

    assert not errors, f"{len(errors)} of {THREADS * CALLS} calls failed; first: {errors[0]!r}"
    assert not mismatches, mismatches[0]
    assert not duplicates, duplicates[0]
    pending = jq.stats().get("default", {}).get("available", 0)
    assert pending <= len(KEYS)


def test_deadlock_in_the_callers_transaction_asks_the_caller_to_retry(pg_queue, pg_url):
    """With ``connection=`` the caller's transaction is aborted: jobkeeper
    cannot retry inside it, and says the caller should (never "unavailable")."""
    jq = pg_queue
    with psycopg.connect(pg_url) as first, psycopg.connect(pg_url) as second:
        jq.enqueue("t", {}, unique_key="a", connection=first)
        jq.enqueue("t", {}, unique_key="b", connection=second)
        failed: list[BaseException] = []

        def cross() -> None:
            try:
                jq.enqueue("t", {}, unique_key="a", connection=second)  # waits for first
            except Exception as exc:
                failed.append(exc)
                second.rollback()  # what the error asks of the caller; frees "b"

        waiter = threading.Thread(target=cross)
        waiter.start()
        # Waiting on second's "b" while second waits on our "a": a deadlock.
        try:
            jq.enqueue("t", {}, unique_key="b", connection=first)
        except Exception as exc:
            failed.append(exc)
            first.rollback()
        waiter.join(timeout=30)
        assert not waiter.is_alive()
        assert len(failed) == 1, failed
        error = failed[0]
        assert isinstance(error, DatabaseError)
        assert not isinstance(error, DatabaseUnavailable)
        assert "retry" in str(error) and "transaction" in str(error), error


def test_a_batch_of_many_unique_keys_leaves_the_lock_table_to_others(pg_queue, pg_url):
    """A lock per key filled PostgreSQL's shared lock table (6,400 entries by
    default): this batch failed with "out of shared memory", and so did other
    sessions' statements while it ran. The keys share a bounded set of locks.
    """
    keys = [f"many-{n}" for n in range(20_000)]
    jobs = pg_queue.enqueue_many([("t", {}, {"unique_key": key}) for key in keys])
    assert [job.unique_key for job in jobs] == keys
    assert len({job.id for job in jobs}) == len(keys)


def test_keys_sharing_one_lock_are_still_locked_before_the_rows_go_in():
    """Two keys of a batch that fall on one lock must still take it: without
    it, two batches holding them in opposite orders deadlock in the index.
    """
    from jobkeeper.backends.postgres.plans import (
        UNIQUE_LOCK_BUCKETS,
        Execute,
        _insert,
        unique_lock_bucket,
    )
    from jobkeeper.models import NewJob

    first, second = "key-14", "key-21"
    assert unique_lock_bucket("t", first) == unique_lock_bucket("t", second)
    buckets = {unique_lock_bucket("t", f"k{n}") for n in range(20_000)}
    assert buckets <= set(range(UNIQUE_LOCK_BUCKETS))
    batch = [
        NewJob(task="t", args_json="{}", queue="default", priority=0, max_attempts=3, unique_key=k)
        for k in (second, first)
    ]
    step = next(_insert(batch, "jobkeeper_public", checked=True))
    assert isinstance(step, Execute) and step.query == "job_insert_many_lock_keys", step
    assert step.params == {"buckets": [unique_lock_bucket("t", first)]}


def test_a_keyed_batch_does_not_wait_for_one_of_another_schema(pg_queue, pg_url, other_pg_url):
    """Break-test: advisory locks are per database, and the unique keys'
    lock keys did not depend on the schema: tenant 1 holding a two-key batch
    open 5 s made tenant 2's batch of 200 unrelated keys wait 4.07 s. Here
    tenant 2 even uses the same keys (certain to share the locks before),
    and must finish while tenant 1's transaction is still open.
    """
    keys = ["a", "b", *(f"k{n}" for n in range(200))]
    with JobQueue(other_pg_url) as other, psycopg.connect(pg_url) as holder:
        other.migrate()
        held = pg_queue.enqueue_many(
            [("t", {}, {"unique_key": key}) for key in keys[:2]], connection=holder
        )
        assert len(held) == 2  # tenant 1's locks are held until `holder` ends
        finished = threading.Event()
        failed: list[BaseException] = []

        def enqueue_other() -> None:
            try:
                jobs = other.enqueue_many([("t", {}, {"unique_key": key}) for key in keys])
                assert [job.unique_key for job in jobs] == keys
            except BaseException as exc:  # reported below
                failed.append(exc)
            finished.set()

        thread = threading.Thread(target=enqueue_other)
        thread.start()
        try:
            done_first = finished.wait(20)
        finally:
            holder.commit()
            thread.join(30)
        assert not failed, failed
        assert done_first, "tenant 2's batch waited for tenant 1's transaction to end"


def held_lock_keys(url: str, buckets: list[int]) -> list[int]:
    """The advisory lock keys a session on ``url`` holds after locking ``buckets``."""
    from jobkeeper.backends.postgres.queries import QUERIES

    with psycopg.connect(url) as conn:
        conn.execute(QUERIES["job_insert_many_lock_keys"], {"buckets": buckets})
        rows = conn.execute(
            "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks "
            "WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid()"
        ).fetchall()
        conn.rollback()
    return sorted(row[0] for row in rows)


def test_each_schema_has_its_own_1024_lock_keys_in_the_buckets_order(
    pg_queue, pg_url, other_pg_url
):
    buckets = [0, 1, 511, 1023]
    mine = held_lock_keys(pg_url, buckets)
    theirs = held_lock_keys(other_pg_url, buckets)
    # One schema: the buckets' keys, in the buckets' order, 1,024 apart at most.
    assert [key - mine[0] for key in mine] == buckets
    assert [key - theirs[0] for key in theirs] == buckets
    assert not set(mine) & set(theirs)
    # jobkeeper's range: "jk" in the top 16 bits.
    assert all(key >> 48 == 0x6A6B for key in mine + theirs)
