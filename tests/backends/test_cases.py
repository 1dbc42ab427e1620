"""Payloads on both backends: NaN/Infinity and unparseable stored args; NUL,
lone surrogates and valid Unicode; large args and the NOTIFY payload limit.
"""

from __future__ import annotations

import json
import math
import threading
import time

import psycopg
import pytest
from psycopg import sql as pgsql

from jobkeeper import JobQueue, JobStatus, PayloadError
from jobkeeper.payload import dumps
from support.db import count, is_pg, sql

from .helpers import claim, current_schema, fail, total_rows

# -- NaN / Infinity ------------------------------------------------------------------------

NON_FINITE = [
    ({"x": math.nan}, "args.x", "nan"),
    ({"x": math.inf}, "args.x", "inf"),
    ({"x": -math.inf}, "args.x", "-inf"),
    ({"a": [1, {"b": math.nan}]}, "args.a[1].b", "nan"),
]


@pytest.mark.parametrize(("args", "path", "shown"), NON_FINITE)
def test_non_finite_args_are_refused_naming_path_and_value(jq, args, path, shown):
    with pytest.raises(PayloadError) as info:
        jq.enqueue("t", args)
    message = str(info.value)
    assert message.startswith(f"{path}: {shown} ")
    assert count(jq) == 0


@pytest.mark.parametrize(("args", "path", "shown"), NON_FINITE)
def test_one_bad_job_in_a_batch_of_ten_inserts_nothing(jq, args, path, shown):
    batch = [("t", {"i": i, "ok": 1.5}) for i in range(10)]
    batch[7] = ("t", args)
    with pytest.raises(PayloadError) as info:
        jq.enqueue_many(batch)
    assert str(info.value).startswith(f"jobs[7]: {path}: {shown} ")
    assert total_rows(jq) == 0


def test_non_finite_args_through_task_options_are_refused_too(jq):
    @jq.task
    def compute(x: float) -> None: ...

    with pytest.raises(PayloadError, match=r"^args\.x: nan"):
        compute.enqueue(x=math.nan)
    with pytest.raises(PayloadError, match=r"^args\.x: inf"):
        compute.options(delay=5).enqueue(x=math.inf)
    assert count(jq) == 0


def insert_raw_args(jq: JobQueue, raw: str) -> int:
    """A row written outside jobkeeper (by hand, by another tool) with ``raw`` args."""
    if is_pg(jq):
        query = "INSERT INTO jobkeeper_jobs (queue, task, args) VALUES ('default', 't', ?::jsonb)"
    else:
        query = "INSERT INTO jobkeeper_jobs (queue, task, args) VALUES ('default', 't', ?)"
    sql(jq, query, (raw,))
    return int(sql(jq, "SELECT max(id) FROM jobkeeper_jobs")[0][0])


def raw_args_cases(jq: JobQueue) -> list[str]:
    if is_pg(jq):
        # jsonb always parses; what can go wrong is a non-object.
        return ["[1, 2]", '"just text"', "null", "42"]
    return ["not json", '{"x": NaN}', "[1, 2]", '{"unterminated": ', ""]


def test_hand_inserted_unparseable_args_never_crash_a_claim(jq):
    raws = raw_args_cases(jq)
    ids = [insert_raw_args(jq, raw) for raw in raws]
    good = jq.enqueue("t", {"fine": True})
    # Reading them back, listing and counting must not raise.
    for job_id in ids:
        job = jq.get_job(job_id)
        assert job is not None
        assert job.args is None
        assert job.args_error and "stored args" in job.args_error
    assert len(jq.list_jobs()) == len(ids) + 1
    assert jq.stats()["default"]["available"] == len(ids) + 1
    # A worker claiming them gets jobs it can fail cleanly.
    claimed = claim(jq, limit=100)
    assert [j.id for j in claimed] == [*ids, good.id]
    for job in claimed[:-1]:
        assert job.args is None
        assert job.args_error
        assert job.status == JobStatus.CLAIMED
    assert claimed[-1].args == {"fine": True} and claimed[-1].args_error is None


# -- NUL and lone surrogates; valid Unicode round-trips ------------------------------------

UNSTORABLE = [
    ({"s": "a\x00b"}, "args.s", "NUL"),
    ({"a\x00": 1}, "args", "NUL"),
    ({"s": "\ud800"}, "args.s", "surrogate"),
    ({"list": ["ok", "x\udfffy"]}, "args.list[1]", "surrogate"),
]


@pytest.mark.parametrize(("args", "path", "kind"), UNSTORABLE)
def test_nul_and_lone_surrogates_get_the_same_clear_error(jq, args, path, kind):
    with pytest.raises(PayloadError) as info:
        jq.enqueue("t", args)
    assert str(info.value).startswith(f"{path}: ")
    assert kind in str(info.value)
    batch = [("t", {"i": i}) for i in range(10)]
    batch[3] = ("t", args)
    with pytest.raises(PayloadError) as info:
        jq.enqueue_many(batch)
    assert str(info.value).startswith(f"jobs[3]: {path}: ")
    assert total_rows(jq) == 0


def test_unique_key_with_nul_is_refused(jq):
    with pytest.raises(PayloadError, match="NUL"):
        jq.enqueue("t", {}, unique_key="a\x00b")
    assert count(jq) == 0


VALID_UNICODE = {
    "s": "héllo ✓ 😀 \u2028",
    "bmp": "中文 العربية Ελληνικά",
    "astral": "𝄞 🏳️‍🌈 \U0010fffd",
    "separators": "\u2028\u2029\u0085",
    "controls": "\x01\x1f\x7f",
    "escapes": 'quote " backslash \\ slash / newline \n tab \t',
    "ключ 🔑": ["значение", {"深い": "値"}],
}


def test_valid_unicode_round_trips_byte_for_byte(jq):
    job = jq.enqueue("t", VALID_UNICODE)
    stored = jq.get_job(job.id)
    assert stored is not None
    assert stored.args == VALID_UNICODE
    for key, value in VALID_UNICODE.items():
        assert key in stored.args
        if isinstance(value, str):
            assert stored.args[key].encode("utf-8") == value.encode("utf-8")
    # Byte for byte up to key order (jsonb stores object keys in its own order).
    canonical = json.dumps(VALID_UNICODE, ensure_ascii=False, sort_keys=True).encode()
    assert json.dumps(stored.args, ensure_ascii=False, sort_keys=True).encode() == canonical
    (claimed,) = claim(jq)
    assert claimed.args == VALID_UNICODE
    batch = jq.enqueue_many([("t", VALID_UNICODE), ("t", {"s": "\u2028"})])
    assert [jq.get_job(j.id).args for j in batch] == [VALID_UNICODE, {"s": "\u2028"}]  # type: ignore[union-attr]


# -- large args and the NOTIFY payload limit (PostgreSQL) ----------------------------------


def args_of_size(size: int) -> dict[str, str]:
    """Args whose canonical JSON is exactly ``size`` bytes."""
    args = {"blob": "x" * (size - len('{"blob":""}'))}
    assert len(dumps(args).encode()) == size
    return args


class Listener:
    """A LISTEN connection on the queue's channel, collecting payloads on a thread."""

    def __init__(self, jq: JobQueue) -> None:
        self.channel = f"jobkeeper_{current_schema(jq)}"
        self.payloads: list[str] = []
        self.conn = psycopg.connect(jq.url.url, autocommit=True)
        self.conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.channel)))

    def drain(self, *, until: int, timeout: float = 20.0) -> list[str]:
        """Collect notifications until ``until`` have arrived in total (or the deadline)."""
        missing = until - len(self.payloads)
        if missing > 0:
            for notify in self.conn.notifies(timeout=timeout, stop_after=missing):
                assert notify.channel == self.channel
                self.payloads.append(notify.payload)
        return self.payloads

    def wait_for(self, payload: str, timeout: float = 20.0) -> bool:
        """Collect notifications until ``payload`` arrives (or the deadline)."""
        deadline = time.monotonic() + timeout
        while payload not in self.payloads and time.monotonic() < deadline:
            for notify in self.conn.notifies(timeout=0.5, stop_after=1):
                self.payloads.append(notify.payload)
        return payload in self.payloads

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def pg_jq(pg_url):
    with JobQueue(pg_url) as jq:
        jq.migrate()
        yield jq


@pytest.mark.parametrize("size", [7_000, 8_000, 9_000, 500_000])
def test_large_args_enqueue_and_wake_a_listener_with_a_small_payload(pg_jq, size):
    listener = Listener(pg_jq)
    try:
        args = args_of_size(size)
        job = pg_jq.enqueue("big", args)
        assert listener.drain(until=1) == ["default"]
        stored = pg_jq.get_job(job.id)
        assert stored is not None and stored.args == args
        in_batch = pg_jq.enqueue_many([("big", args), ("big", args)])
        assert len(in_batch) == 2
        assert listener.drain(until=2) == ["default", "default"]
    finally:
        listener.close()


def test_five_thousand_jobs_in_one_batch_send_one_small_notification(pg_jq):
    listener = Listener(pg_jq)
    try:
        jobs = pg_jq.enqueue_many(
            [("bulk", {"i": i, "pad": "p" * 100}, {"queue": f"q{i % 3}"}) for i in range(5_000)]
        )
        assert len(jobs) == 5_000
        assert [j.args["i"] for j in jobs] == list(range(5_000))  # type: ignore[index]
        payloads = listener.drain(until=3)
        assert sorted(payloads) == ["q0", "q1", "q2"]
        # Nothing more arrives: one notification per queue, not per job.
        assert list(listener.conn.notifies(timeout=0.3)) == []
    finally:
        listener.close()
    assert count(pg_jq) == 5_000


def test_two_hundred_character_names_enqueue_and_notify(pg_jq):
    listener = Listener(pg_jq)
    try:
        queue, task = "q" * 200, "t" * 200
        job = pg_jq.enqueue(task, args_of_size(9_000), queue=queue)
        assert (job.queue, job.task) == (queue, task)
        assert listener.drain(until=1) == [queue]
        assert [j.id for j in claim(pg_jq, queue)] == [job.id]
    finally:
        listener.close()


def test_scheduled_jobs_notify_when_staged_not_when_inserted(pg_jq):
    """The insert tells only when the job comes due ("queue seconds", small
    whatever the args); "available" is announced when it is staged."""
    listener = Listener(pg_jq)
    try:
        pg_jq.enqueue("t", args_of_size(9_000), delay=3600)
        (due,) = listener.drain(until=1)
        queue, seconds = due.split(" ")
        assert queue == "default" and 3590 < float(seconds) <= 3600
        assert list(listener.conn.notifies(timeout=0.3)) == []
        sql(pg_jq, "UPDATE jobkeeper_jobs SET scheduled_at = now() - interval '1 second'")
        assert pg_jq.backend.job_stage_due().staged == 1
        assert listener.drain(until=2)[1:] == ["default"]
    finally:
        listener.close()


@pytest.mark.parametrize("limit", [10_000, 1 << 20])
def test_over_limit_args_are_refused_naming_size_and_limit(make_queue, limit):
    jq = make_queue(max_payload_bytes=limit)
    assert jq.enqueue("t", args_of_size(limit)).id > 0
    with pytest.raises(PayloadError) as info:
        jq.enqueue("t", args_of_size(limit + 1))
    message = str(info.value)
    assert f"{limit + 1} bytes" in message
    assert f"max_payload_bytes={limit}" in message
    with pytest.raises(PayloadError, match=rf"^jobs\[1\]: .*{limit + 1} bytes"):
        jq.enqueue_many([("t", {}), ("t", args_of_size(limit + 1))])
    assert count(jq) == 1


def test_concurrent_large_enqueues_all_land(pg_jq):
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


def test_retry_and_requeue_wake_a_listener(pg_jq):
    """Jobs made available again by retry / requeue_dead wake listening workers
    like fresh enqueues do (otherwise they wait for the next poll)."""
    jobs = [pg_jq.enqueue("t", {"n": n}, queue=f"q{n}") for n in range(3)]
    for job in jobs:
        (running,) = claim(pg_jq, job.queue)
        assert fail(pg_jq, running, "dead") == {job.id}
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
