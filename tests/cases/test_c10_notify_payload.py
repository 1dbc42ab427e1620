"""C-10: the NOTIFY 8000-byte payload limit breaks enqueue (odd-jobs#42,
awx#12999).

PostgreSQL only: SQLite wakes workers without NOTIFY. Notifications carry a
queue name (at most 200 ASCII characters) or, for a delayed job, the queue
and seconds until it is due: small and bounded whatever the args or batch
size. Args up to ``max_payload_bytes`` enqueue and wake a listening worker;
past it they are refused naming the size and the limit, on both backends,
and nothing is written.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest

from backends.helpers import claim, fail, total_rows
from cli.helpers import assert_one_line_error
from jobkeeper import JobQueue, JobStatus, PayloadError
from jobkeeper.payload import dumps
from support.cli import Cli
from support.db import count, sql
from support.notify import PAYLOAD_BOUND, Listener
from support.settings import FAST
from support.waiting import wait_for, wait_status
from worker.helpers import running


def args_of_size(size: int) -> dict[str, str]:
    """Args whose canonical JSON is exactly ``size`` bytes."""
    args = {"blob": "x" * (size - len('{"blob":""}'))}
    assert len(dumps(args).encode()) == size
    return args


@pytest.mark.parametrize("size", [7_000, 8_000, 9_000, 500_000])
def test_c10_large_args_enqueue_and_notify_only_the_queue(pg_jq, listener, size):
    args = args_of_size(size)
    job = pg_jq.enqueue("big", args)
    assert listener.drain(until=1) == ["default"]
    stored = pg_jq.get_job(job.id)
    assert stored is not None and stored.args == args
    in_batch = pg_jq.enqueue_many([("big", args), ("big", args)])
    assert len(in_batch) == 2
    assert listener.drain(until=2) == ["default", "default"]


def test_c10_five_thousand_jobs_in_one_batch_send_one_small_notification_per_queue(pg_jq, listener):
    jobs = pg_jq.enqueue_many(
        [("bulk", {"i": i, "pad": "p" * 100}, {"queue": f"q{i % 3}"}) for i in range(5_000)]
    )
    assert len(jobs) == 5_000
    assert [j.args["i"] for j in jobs] == list(range(5_000))  # type: ignore[index]
    payloads = listener.drain(until=3)
    assert sorted(payloads) == ["q0", "q1", "q2"]
    # Nothing more arrives: one notification per queue, not per job.
    assert list(listener.conn.notifies(timeout=0.3)) == []
    assert count(pg_jq) == 5_000


def test_c10_a_thousand_enqueues_in_one_transaction_notify_small(pg_jq, listener):
    """One caller transaction, one enqueue per job (the trigger fires per
    statement): PostgreSQL folds the identical notifications at commit.
    (1,000, not 5,000: one round trip each; the batch above has 5,000.)"""
    args = args_of_size(1_000)
    with psycopg.connect(pg_jq.url.url) as conn:
        for i in range(1_000):
            pg_jq.enqueue("bulk", args, queue=f"q{i % 2}", connection=conn)
        conn.commit()
    assert sorted(listener.drain(until=2)) == ["q0", "q1"]
    assert list(listener.conn.notifies(timeout=0.3)) == []
    assert count(pg_jq) == 1_000


def test_c10_two_hundred_character_names_enqueue_and_notify(pg_jq, listener):
    queue, task = "q" * 200, "t" * 200
    job = pg_jq.enqueue(task, args_of_size(9_000), queue=queue)
    assert (job.queue, job.task) == (queue, task)
    later = pg_jq.enqueue(task, args_of_size(500_000), queue=queue, delay=3600)
    assert later.status == JobStatus.SCHEDULED
    first, due = listener.drain(until=2)
    assert first == queue
    assert due.split(" ")[0] == queue and len(due.encode()) <= PAYLOAD_BOUND
    assert [j.id for j in claim(pg_jq, queue)] == [job.id]


def test_c10_scheduled_jobs_notify_when_staged_not_when_inserted(pg_jq, listener):
    """The insert tells only when the job comes due ("queue seconds", small
    whatever the args); "available" is announced when it is staged."""
    pg_jq.enqueue("t", args_of_size(9_000), delay=3600)
    (due,) = listener.drain(until=1)
    queue, seconds = due.split(" ")
    assert queue == "default" and 3590 < float(seconds) <= 3600
    assert list(listener.conn.notifies(timeout=0.3)) == []
    sql(pg_jq, "UPDATE jobkeeper_jobs SET scheduled_at = now() - interval '1 second'")
    assert pg_jq.backend.job_stage_due().staged == 1
    assert listener.drain(until=2)[1:] == ["default"]


def test_c10_retry_and_requeue_wake_a_listener(pg_jq):
    """Jobs made available again by retry / requeue_dead wake listening workers
    like fresh enqueues do (otherwise they wait for the next poll)."""
    jobs = [pg_jq.enqueue("t", {"n": n}, queue=f"q{n}") for n in range(3)]
    for job in jobs:
        (held,) = claim(pg_jq, job.queue)
        assert fail(pg_jq, held, "dead") == {job.id}
    listener = Listener(pg_jq)
    try:
        pg_jq.retry(jobs[0].id)
        assert listener.wait_for("q0")
        assert pg_jq.requeue_dead([jobs[1].id]) == [jobs[1].id]
        assert listener.wait_for("q1")
        assert pg_jq.requeue_dead() == [jobs[2].id]
        assert listener.wait_for("q2")
        assert set(listener.payloads) == {"q0", "q1", "q2"}
    finally:
        listener.close()


def test_c10_concurrent_large_enqueues_all_land(pg_jq):
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            for _ in range(5):
                pg_jq.enqueue("big", args_of_size(9_000))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert count(pg_jq) == 20
    assert json.loads(sql(pg_jq, "SELECT args::text FROM jobkeeper_jobs LIMIT 1")[0][0])


def test_c10_a_listening_worker_is_woken_for_large_args_and_long_names(pg_url, monkeypatch):
    """A real worker that polls only every 30 s runs each job at once: the
    notification, not the poll, wakes it."""
    with JobQueue(pg_url, **{**FAST, "poll_interval": 30.0}) as jq:
        jq.migrate()
        queue = "q" * 200
        ran: list[int] = []

        @jq.task(name="t" * 200, queue=queue)
        def big(blob: str) -> None:
            ran.append(len(blob))

        heard: list[str] = []
        listening = threading.Event()
        # The worker listens on a dedicated backend of the same class.
        backend_class = type(jq.backend)
        real_listen = backend_class.listen

        def listen(self: Any, *, on_queue: Any, **kwargs: Any) -> None:
            def spy(payload: str) -> None:
                heard.append(payload)
                if payload == "*":
                    listening.set()
                on_queue(payload)

            real_listen(self, on_queue=spy, **kwargs)

        monkeypatch.setattr(backend_class, "listen", listen)
        with running(jq.worker(queues=[queue], concurrency=2)):
            assert listening.wait(30), "the worker never listened"
            started = time.monotonic()
            for size in (7_000, 9_000, 500_000):
                job = big.enqueue(blob="x" * size)
                wait_status(jq, [job.id], {JobStatus.COMPLETED}, timeout=20)
            assert time.monotonic() - started < 25  # each well inside one 30 s poll
            wait_for(lambda: heard.count(queue) >= 3, what="three wake-ups", timeout=10)
        assert ran == [7_000, 9_000, 500_000]


# -- over the payload limit: both backends -------------------------------------------------


@pytest.mark.parametrize("limit", [10_000, 1 << 20])
def test_c10_over_limit_args_are_refused_naming_size_and_limit(make_queue, limit):
    jq = make_queue(max_payload_bytes=limit)
    assert jq.enqueue("t", args_of_size(limit)).id > 0
    with pytest.raises(PayloadError) as info:
        jq.enqueue("t", args_of_size(limit + 1))
    message = str(info.value)
    assert message == (
        f"args: encoded size {limit + 1} bytes exceeds max_payload_bytes={limit} bytes"
    )
    with pytest.raises(PayloadError, match=rf"^jobs\[1\]: .*{limit + 1} bytes"):
        jq.enqueue_many([("t", {}), ("t", args_of_size(limit + 1))])
    assert total_rows(jq) == 1


def test_c10_over_limit_args_through_the_cli_exit_2(db_url, capsys):
    cli = Cli(db_url, capsys)
    cli.ok("migrate")
    limit = 1 << 20  # the default
    code, out, err = cli("enqueue", "t", "--args", dumps(args_of_size(limit + 1)))
    assert code == 2 and out == ""
    assert_one_line_error(err, f"{limit + 1} bytes", f"max_payload_bytes={limit}")
    with JobQueue(db_url) as jq:
        assert total_rows(jq) == 0
