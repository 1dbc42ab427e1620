"""Queue settings, backpressure and the limited claim, on both backends
(in-process: the claims are the backend's, as a worker's producer makes them)."""

from __future__ import annotations

import asyncio
import threading
import warnings

import psycopg
import pytest

from jobkeeper import ConfigError, DatabaseError, JobQueue, JobStatus, QueueFull, QueueInfo
from jobkeeper.models import WorkerInfo
from jobkeeper.outcomes import failed_attempt, released_attempt
from support.db import sql
from support.threads import run_threads


def claim(jq: JobQueue, queue: str, limit: int = 100, worker: str = "w1") -> list[int]:
    return [j.id for j in jq.backend.job_claim(worker_id=worker, queue=queue, limit=limit)]


def pending(jq: JobQueue, queue: str) -> int:
    return sum(
        n
        for s, n in jq.stats().get(queue, {}).items()
        if s not in ("running", "completed", "cancelled", "dead")
    )


def test_configure_changes_only_what_is_given_and_none_lifts(jq):
    info = jq.configure_queue("emails", concurrency=5, rate_limit="100/m", max_pending=50)
    assert info == QueueInfo("emails", False, 5, "100/m", 50, info.counts)
    assert jq.configure_queue("emails", rate_limit="3/s").concurrency == 5
    info = jq.configure_queue("emails", concurrency=None)
    assert (info.concurrency, info.rate_limit, info.max_pending) == (None, "3/s", 50)
    jq.pause("emails")
    info = jq.configure_queue("emails", max_pending=None, rate_limit=None)
    assert (info.paused, info.concurrency, info.rate_limit, info.max_pending) == (
        True,
        None,
        None,
        None,
    )
    # Settings live in the database: a fresh JobQueue (a restart) sees them.
    with JobQueue(jq.url.url) as again:
        assert [q.name for q in again.queues() if q.paused] == ["emails"]
    jq.resume("emails")
    assert jq.queues() == []  # no jobs and no settings left


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": 0}, "at least 1"),
        ({"concurrency": True}, "concurrency must be an int"),
        ({"rate_limit": "10/d"}, "N/s, N/m or N/h"),
        ({"rate_limit": "0/s"}, "between 1"),
        ({"rate_limit": 10}, "string like"),
        ({"max_pending": -1}, "max_pending"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(jq, kwargs, message):
    jq.configure_queue("q", concurrency=2)
    with pytest.raises(ConfigError, match=message):
        jq.configure_queue("q", **{"rate_limit": "7/s", **kwargs})
    assert jq.queues()[0].concurrency == 2 and jq.queues()[0].rate_limit is None


def test_queues_lists_every_queue_with_jobs_or_settings(jq):
    jq.enqueue("t", {}, queue="a")
    jq.configure_queue("b", rate_limit="5/h")
    listed = {q.name: q for q in jq.queues()}
    assert sorted(listed) == ["a", "b"]
    assert listed["a"].counts["available"] == 1 and listed["a"].concurrency is None
    assert listed["b"].rate_limit == "5/h" and listed["b"].counts["available"] == 0


def test_queues_past_the_finished_cap_name_their_estimates_and_leave_old_queues_out(jq):
    # What the docs say of queues(): finished jobs are read from the newest
    # exact_below + 1 only; a queue whose finished jobs are all older drops
    # out, and the counts that are estimates say so (helper-54 saw neither
    # said). exact_below stands in for the default 100,000.
    from jobkeeper.models import Completion
    from jobkeeper.outcomes import claim_of

    def finish(queue: str, n: int) -> None:
        jq.enqueue_many([("t", {"i": i}, {"queue": queue}) for i in range(n)])
        claimed = jq.backend.job_claim(worker_id="w1", queue=queue, limit=n)
        jq.backend.job_complete_many(
            completions=[Completion(claim_of(j), None) for j in claimed], delete=False
        )

    finish("old", 2)
    if jq.backend.name == "postgresql":
        sql(jq, "UPDATE jobkeeper_jobs SET finished_at = now() - interval '1 hour'")
    else:
        sql(jq, "UPDATE jobkeeper_jobs SET finished_at = finished_at - 3600")
    finish("new", 6)
    jq.enqueue("t", {}, queue="live")
    exact = {q.name: q for q in jq.queues()}
    assert sorted(exact) == ["live", "new", "old"]
    assert exact["old"].counts["completed"] == 2 and exact["old"].estimated == ()
    capped = {q.name: q for q in jq.queues(exact_below=3)}
    assert sorted(capped) == ["live", "new", "old"]
    assert capped["old"].counts["completed"] == 2 and capped["old"].estimated == (
        "cancelled",
        "completed",
    )
    assert capped["new"].estimated == ("cancelled", "completed")
    assert capped["live"].counts["available"] == 1
    assert capped["new"].as_dict()["estimated"] == ["cancelled", "completed"]
    for bad in (0, -1, True, "5", 2.5, 2**63 - 1, 10**30):
        # The largest ones were refused by the database ("bigint out of
        # range") or raised a bare OverflowError (SQLite; helper-55).
        with pytest.raises(ConfigError, match="exact_below must be an int from 1 to"):
            jq.queues(exact_below=bad)
        with pytest.raises(ConfigError, match="exact_below"):
            jq.queue_counts(exact_below=bad)


def test_pause_stops_claims_and_resume_restarts_them(jq):
    jq.enqueue("t", {}, queue="q")
    jq.pause("q")
    assert claim(jq, "q") == []
    jq.resume("q")
    assert len(claim(jq, "q")) == 1


def test_concurrency_counts_claimed_and_running_and_a_rescue_frees_it(jq):
    for _ in range(6):
        jq.enqueue("t", {}, queue="q")
    jq.configure_queue("q", concurrency=2)
    first = claim(jq, "q", worker="a")
    assert len(first) == 2
    assert claim(jq, "q", worker="b") == []  # prefetch cannot go past the cap
    # The holder "a" never registered: its jobs are rescuable at once, and
    # once returned they stop counting.
    for job in jq.backend.job_rescue_candidates(rescue_after=0.0, limit=10):
        jq.backend.job_fail_many(failures=[released_attempt(job, "lost")])
    assert len(claim(jq, "q", worker="b")) == 2


def test_rate_limit_counts_claims_in_the_window(jq):
    for _ in range(5):
        jq.enqueue("t", {}, queue="q")
    jq.configure_queue("q", rate_limit="2/h")
    assert len(claim(jq, "q")) == 2
    assert claim(jq, "q") == []
    # Claim times, not job rows, are counted: deleting the jobs changes nothing.
    sql(jq.url.url, "DELETE FROM jobkeeper_jobs WHERE status = 'claimed'")
    assert claim(jq, "q") == []


def test_serial_keys_one_held_job_per_key_in_order(jq):
    jq.enqueue("t", {}, queue="q", serial_key="a", priority=3)
    a1 = jq.enqueue("t", {}, queue="q", serial_key="a", priority=1)
    b = jq.enqueue("t", {}, queue="q", serial_key="b")
    free = jq.enqueue("t", {}, queue="q")
    jq.enqueue("t", {}, queue="other", serial_key="a")
    assert sorted(claim(jq, "q")) == sorted([a1.id, b.id, free.id])
    assert claim(jq, "q") == []
    assert claim(jq, "other") == []  # key "a" is held, whatever the queue
    assert jq.get_job(a1.id).serial_key == "a"


def test_a_key_waiting_out_a_retry_does_not_hold_it(jq):
    first = jq.enqueue("t", {}, queue="q", serial_key="k")
    second = jq.enqueue("t", {}, queue="q", serial_key="k")
    (held,) = jq.backend.job_claim(worker_id="w", queue="q", limit=10)
    assert held.id == first.id
    failure = failed_attempt(held, jq.settings, error="boom", retry_in=3600)
    jq.backend.job_fail_many(failures=[failure])
    assert jq.get_job(first.id).status == JobStatus.RETRYABLE
    assert claim(jq, "q") == [second.id]


def test_max_pending_refuses_single_and_batch_writing_nothing(jq):
    jq.configure_queue("q", max_pending=3)
    jq.enqueue_many([("t", {}, {"queue": "q"})] * 2)
    with pytest.raises(QueueFull) as caught:
        jq.enqueue_many([("t", {}, {"queue": "q"}), ("t", {}, {"queue": "other"})] * 2)
    assert (caught.value.queue, caught.value.limit, caught.value.count) == ("q", 3, 2)
    assert "'q'" in str(caught.value) and "max_pending=3" in str(caught.value)
    assert pending(jq, "q") == 2 and pending(jq, "other") == 0
    jq.enqueue("t", {}, queue="q", delay=60)  # scheduled jobs count too
    with pytest.raises(QueueFull):
        jq.enqueue("t", {}, queue="q")
    with pytest.raises(QueueFull):
        jq.enqueue("t", {}, queue="q", unique_key="u")
    assert pending(jq, "q") == 3


def test_a_duplicate_of_a_pending_job_is_returned_at_max_pending(jq):
    """Found by a break-test: on PostgreSQL the retry of an enqueue that had
    committed (the README's advice after a lost connection: retry with a
    unique_key) got QueueFull from a queue at its limit, with the job there.
    Only the rows an enqueue adds count against max_pending."""
    jq.configure_queue("q", max_pending=1)
    first = jq.enqueue("t", {}, queue="q", unique_key="order-7")
    assert jq.enqueue("t", {}, queue="q", unique_key="order-7").id == first.id
    (again,) = jq.enqueue_many([("t", {}, {"queue": "q", "unique_key": "order-7"})])
    assert again.id == first.id
    waited = asyncio.run(jq.enqueue_async("t", {}, queue="q", unique_key="order-7"))
    assert waited.id == first.id
    # A batch that would add a row past the limit is refused whole.
    batch = [("t", {}, {"queue": "q", "unique_key": key}) for key in ("order-7", "order-8")]
    with pytest.raises(QueueFull) as caught:
        jq.enqueue_many(batch)
    assert (caught.value.limit, caught.value.count) == (1, 1)
    assert pending(jq, "q") == 1
    # Under a limit lowered past what is pending, a duplicate still adds nothing.
    jq.configure_queue("q", max_pending=0)
    assert jq.enqueue("t", {}, queue="q", unique_key="order-7").id == first.id
    with pytest.raises(QueueFull):
        jq.enqueue("t", {}, queue="q", unique_key="order-9")
    assert pending(jq, "q") == 1


@pytest.mark.parametrize("keyed", [False, True])
def test_concurrent_keyed_enqueuers_never_pass_max_pending(make_queue, keyed):
    """Batches with unique keys are counted after their rows are in: racing
    ones still never take the queue past its limit."""
    jq = make_queue()
    jq.configure_queue("q", max_pending=30)
    queues = [make_queue() for _ in range(4)]
    refused: list[int] = []

    def enqueue(mine: JobQueue, index: int) -> None:
        for i in range(12):
            # Each key twice, so half the calls resolve to a pending duplicate.
            key = f"{index}-{i // 2}" if keyed else None
            try:
                if i % 3:
                    mine.enqueue("t", {}, queue="q", unique_key=key)
                else:
                    options = {"queue": "q", "unique_key": key} if keyed else {"queue": "q"}
                    mine.enqueue_many([("t", {}, options), ("t", {}, {"queue": "q"})])
            except QueueFull:
                refused.append(i)

    assert run_threads(enqueue, [(q, n) for n, q in enumerate(queues)]) == []
    assert refused
    assert 30 - 2 < pending(jq, "q") <= 30


def test_keyed_and_unkeyed_enqueues_in_callers_transactions_do_not_deadlock(pg_url):
    """Found by a break-test of the change that counts keyed batches after
    their rows: it inserted a keyed batch's rows before locking the queue's
    row, while an unkeyed enqueue locks the row first. T1 (unkeyed, holding
    q's row) then keyed K; T2 keyed K in between: PostgreSQL aborted T2 for a
    deadlock. Every enqueue locks the queue first; T2 waits for T1, then
    finds K pending and returns it."""
    with JobQueue(pg_url) as jq:
        jq.migrate()
        jq.configure_queue("q", max_pending=100)
        outcome: dict[str, object] = {}
        with psycopg.connect(pg_url) as first, psycopg.connect(pg_url) as second:
            with first.transaction():
                jq.enqueue("t", {}, queue="q", connection=first)

                def other() -> None:
                    try:
                        with second.transaction():
                            outcome["T2"] = jq.enqueue(
                                "t", {}, queue="q", unique_key="K", connection=second
                            ).id
                    except Exception as exc:  # the deadlock, reported below
                        outcome["T2"] = exc

                waiter = threading.Thread(target=other)
                waiter.start()
                waiter.join(timeout=1.0)  # T2 waits on q's row (it would insert K first before)
                assert waiter.is_alive()
                keyed = jq.enqueue("t", {}, queue="q", unique_key="K", connection=first)
            waiter.join(timeout=30)
        assert outcome["T2"] == keyed.id, outcome
        assert pending(jq, "q") == 2


def test_operator_actions_are_never_refused(jq):
    job = jq.enqueue("t", {}, queue="q")
    jq.cancel(job.id)
    for _ in range(2):
        jq.enqueue("t", {}, queue="q")
    jq.configure_queue("q", max_pending=2)
    assert jq.retry(job.id).status == JobStatus.AVAILABLE
    assert pending(jq, "q") == 3


@pytest.mark.parametrize(
    ("limit", "rounds", "batch"),
    [(25, 15, 2), (500, 4, 90)],  # 90: past COPY_MIN_JOBS, checked after the COPY
)
def test_concurrent_enqueuers_never_pass_max_pending(make_queue, limit, rounds, batch):
    jq = make_queue()
    jq.configure_queue("q", max_pending=limit)
    queues = [make_queue() for _ in range(4)]
    refused = []

    def enqueue(mine: JobQueue) -> None:
        for i in range(rounds):
            try:
                if i % 2:
                    mine.enqueue("t", {}, queue="q")
                else:
                    mine.enqueue_many([("t", {}, {"queue": "q"})] * batch)
            except QueueFull:
                refused.append(i)

    assert run_threads(enqueue, [(q,) for q in queues]) == []
    assert refused
    assert limit - batch < pending(jq, "q") <= limit


def test_concurrent_claims_never_pass_the_cap(make_queue):
    jq = make_queue()
    jq.enqueue_many([("t", {}, {"queue": "q"})] * 200)
    jq.configure_queue("q", concurrency=7)
    claimed: list[int] = []
    lock = threading.Lock()
    backends = [jq.backend.dedicated() for _ in range(6)]

    def work(index: int) -> None:
        for _ in range(20):
            jobs = backends[index].job_claim(worker_id=f"w{index}", queue="q", limit=5)
            with lock:
                claimed.extend(j.id for j in jobs)

    errors = run_threads(work, [(i,) for i in range(6)])
    for backend in backends:
        backend.close()
    assert errors == []
    assert len(claimed) == 7 == len(set(claimed))


def test_configure_and_pause_warn_while_an_old_worker_is_registered(jq):
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo("new", "h", 1, ["q"], now, now))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jq.pause("q")  # only workers of this version: no warning
    sql(jq.url.url, "UPDATE jobkeeper_workers SET version = NULL")
    with pytest.warns(UserWarning, match="older than flow control") as warned:
        jq.configure_queue("q", concurrency=3)
    # Pointed at the caller's line, not at jobkeeper's (helper-83).
    assert [w.filename for w in warned] == [__file__]
    with pytest.warns(UserWarning, match="no version") as warned:
        jq.pause("q")
    assert [w.filename for w in warned] == [__file__]
    assert jq.workers()[0].version is None


def test_the_cli_says_once_that_an_old_worker_ignores_a_queue_change(jq):
    # helper-83: the log line, then the same as a Python warning pointing
    # inside jobkeeper.
    import subprocess
    import sys
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo("old", "h", 1, ["q"], now, now))
    sql(jq.url.url, "UPDATE jobkeeper_workers SET version = NULL")
    for argv in (["queues", "pause", "q"], ["queues", "set", "q", "--concurrency", "2"]):
        done = subprocess.run(
            [sys.executable, "-m", "jobkeeper", "--database", jq.url.url, *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("older than flow control") == 1, done.stderr
        assert "UserWarning" not in done.stderr


def test_workers_record_their_version(jq):
    from datetime import UTC, datetime

    import jobkeeper

    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo("w", "h", 1, ["q"], now, now))
    expected = f"{jobkeeper.__version__} (schema {jq.backend.schema_expected()})"
    assert [w.version for w in jq.workers()] == [expected]


@pytest.mark.parametrize("size", [40, 600])
def test_max_pending_holds_inside_callers_repeatable_read_transactions(pg_url, size):
    """Two callers' REPEATABLE READ transactions whose snapshots predate each
    other's batch: the count in the second one's snapshot misses the first
    batch, so the queue row's newer version must fail it (a newcomer's
    break-test: both 600-job batches passed a limit of 1000)."""
    jq = JobQueue(pg_url)
    jq.migrate()
    jq.configure_queue("q", max_pending=int(size * 1.5))
    first, second = psycopg.connect(pg_url), psycopg.connect(pg_url)
    try:
        for conn in (first, second):
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.execute("SELECT 1")  # both snapshots taken now
        jq.enqueue_many([("t", {}, {"queue": "q"})] * size, connection=first)
        first.commit()
        with pytest.raises(DatabaseError, match="retry the whole transaction"):
            jq.enqueue_many([("t", {}, {"queue": "q"})] * size, connection=second)
        second.rollback()
        with pytest.raises(QueueFull):  # run again, in a new snapshot
            jq.enqueue_many([("t", {}, {"queue": "q"})] * size, connection=second)
        second.rollback()
    finally:
        first.close()
        second.close()
    assert pending(jq, "q") == size
    jq.close()


def test_a_serial_key_past_its_size_in_bytes_is_refused_by_name_on_both_backends(jq):
    # helper-83: 950 CJK characters (2,850 bytes) passed the 1,000-character
    # check; PostgreSQL's serial-key index refused the row, reported as
    # "unavailable", while SQLite stored it.
    from jobkeeper import ConfigError

    too_big = "中" * 667  # 2,001 bytes
    for enqueue in (
        lambda: jq.enqueue("t", {}, queue="q", serial_key=too_big),
        lambda: jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": too_big})]),
    ):
        with pytest.raises(ConfigError, match=r"serial_key is 2001 bytes in UTF-8 .* 2000 bytes"):
            enqueue()
    assert jq.stats() == {}
    # At the limit, with the longest queue name, both backends store it.
    longest = "中" * 666 + "ab"
    job = jq.enqueue("t", {}, queue="q" * 200, serial_key=longest)
    assert jq.get_job(job.id).serial_key == longest


def test_a_row_past_postgresqls_limits_is_refused_data_not_an_outage(pg_url):
    # The kind of helper-83's serial key: an index entry past 2,704 bytes
    # read as "PostgreSQL ... is unavailable", which callers retry for ever.
    import psycopg

    from jobkeeper import DatabaseUnavailable, DataRejected

    with JobQueue(pg_url) as jq:
        jq.migrate()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CREATE INDEX test_args_idx ON jobkeeper_jobs ((args::text))")
        try:
            with pytest.raises(DataRejected, match="refused the data") as refused:
                jq.enqueue("t", {"blob": "x" * 9000, "n": list(range(2000))})
            assert not isinstance(refused.value, DatabaseUnavailable)
        finally:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("DROP INDEX test_args_idx")
