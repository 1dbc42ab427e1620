"""Hostile input through the Python API, on both backends.

Every call either stores exactly what was given (read back equal, as JSON) or
is refused with a clear one-line ``PayloadError``/``ConfigError`` naming the
field, with nothing written; no other exception escapes, no SQL slips
through (injection strings are stored verbatim and the tables survive), and
a worker runs whatever was accepted, or fails hand-inserted garbage cleanly,
without crashing.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobkeeper import ConfigError, JobQueue, JobStatus, PayloadError
from jobkeeper.config import UNIQUE_KEY_MAX_LENGTH
from support.db import sql
from support.settings import FAST

from .strategies import (
    FUZZ,
    NAME_RULE,
    HugeInt,
    any_text,
    hostile_args,
    json_values,
    name_text,
    row_count,
    same_json,
    storable_args,
)

pytestmark = pytest.mark.slow

#: Each example runs a worker: fewer of them.
WORKER_FUZZ = settings(FUZZ, max_examples=8)


def assert_clear(exc: Exception, *, starts: str | None = None) -> None:
    message = str(exc)
    assert message and "\n" not in message, repr(message)
    assert len(message) < 1000, message
    if starts is not None:
        assert message.startswith(starts), message


def max_id(jq) -> int:
    live = sql(jq, "SELECT coalesce(max(id), 0) FROM jobkeeper_jobs")[0][0]
    dead = sql(jq, "SELECT coalesce(max(id), 0) FROM jobkeeper_dead_letters")[0][0]
    return max(int(live), int(dead))


@FUZZ
@given(args=hostile_args)
@example(args={"x": HugeInt(10**5000)})  # longer than Python's int-to-str limit
@example(args=HugeInt(10**5000))  # ... and the error message must not repr it
@example(args={HugeInt(10**5000): 1})
@example(args={"a": [1, {"b": float("nan")}]})
@example(args={"s": "a\x00b", "k\ud800": 1})
def test_enqueue_stores_args_exactly_or_refuses_them(jq, args):
    before = row_count(jq)
    try:
        job = jq.enqueue("fuzz.task", args)
    except PayloadError as exc:
        assert_clear(exc, starts="args")
        assert row_count(jq) == before
        return
    assert row_count(jq) == before + 1
    expected = {} if args is None else args  # None: no arguments
    stored = jq.get_job(job.id)
    assert stored is not None
    assert same_json(stored.args, expected), (stored.args, args)
    assert same_json(job.args, expected)


@FUZZ
@given(task=name_text, queue=name_text)
def test_task_and_queue_names_follow_the_documented_rule(jq, task, queue):
    valid = bool(NAME_RULE.fullmatch(task) and NAME_RULE.fullmatch(queue))
    before = row_count(jq)
    try:
        job = jq.enqueue(task, {"probe": task}, queue=queue)
    except ConfigError as exc:
        assert not valid, f"valid names refused: {task!r} {queue!r}: {exc}"
        assert_clear(exc)
        assert "name" in str(exc)
        assert row_count(jq) == before
        return
    assert valid, f"invalid names accepted: {task!r} {queue!r}"
    stored = jq.get_job(job.id)
    assert stored is not None
    assert (stored.task, stored.queue, stored.args) == (task, queue, {"probe": task})


@FUZZ
@given(key=any_text | st.integers() | st.none() | st.binary(max_size=3))
def test_unique_keys_are_stored_verbatim_or_refused(jq, key):
    valid = key is None or (
        isinstance(key, str)
        and 0 < len(key) <= UNIQUE_KEY_MAX_LENGTH
        and "\x00" not in key
        and not any("\ud800" <= c <= "\udfff" for c in key)
    )
    before = row_count(jq)
    try:
        first = jq.enqueue("fuzz.unique", {"k": 1}, unique_key=key)
        second = jq.enqueue("fuzz.unique", {"k": 2}, unique_key=key)
    except (ConfigError, PayloadError) as exc:
        assert not valid, f"valid unique_key {key!r} refused: {exc}"
        assert_clear(exc)
        assert row_count(jq) == before
        return
    assert valid, f"invalid unique_key {key!r} accepted"
    if key is None:
        assert first.id != second.id
    else:
        # The first job is still pending: the second enqueue returns it.
        assert first.id == second.id
        stored = jq.get_job(first.id)
        assert stored is not None
        assert stored.unique_key == key
        assert stored.args == {"k": 1}


options = st.fixed_dictionaries(
    {},
    optional={
        "queue": name_text,
        "priority": st.integers() | st.floats() | st.booleans() | st.none() | any_text,
        "max_attempts": st.integers(-2, 2_000_000) | st.floats() | st.booleans(),
        "delay": st.floats() | st.integers(-5, 10**13) | any_text,
        "run_at": st.datetimes(timezones=st.none() | st.just(UTC)),
        "unique_key": any_text | st.none(),
        "bogus": st.integers(),
        "connection": st.none(),
    },
)


@FUZZ
@given(
    items=st.lists(
        st.tuples(name_text, hostile_args)
        | st.tuples(name_text, hostile_args, options)
        | st.sampled_from([None, ("only-a-task",), "text", ("t", {}, {}, {})]),
        max_size=6,
    )
)
def test_enqueue_many_is_all_or_nothing(jq, items):
    before, top = row_count(jq), max_id(jq)
    try:
        jobs = jq.enqueue_many(items)
    except (PayloadError, ConfigError) as exc:
        assert_clear(exc)
        assert re.match(r"jobs\[\d+\]: ", str(exc)), str(exc)
        assert row_count(jq) == before
        return
    assert len(jobs) == len(items)
    new_ids = {job.id for job in jobs if job.id > top}
    assert row_count(jq) == before + len(new_ids)
    for job, item in zip(jobs, items, strict=True):
        stored = jq.get_job(job.id)
        assert stored is not None
        assert stored.task == item[0]
        opts: dict[str, Any] = item[2] if len(item) == 3 else {}
        if job.id in new_ids:
            assert same_json(stored.args, {} if item[1] is None else item[1])
            assert stored.queue == (opts.get("queue") or "default")
            assert stored.unique_key == opts.get("unique_key")


@contextlib.contextmanager
def echo_queue(url: str, queue: str) -> Iterator[JobQueue]:
    """A migrated queue with a ``fuzz.echo`` task, closed after each example
    (an open pool per example would exhaust the server's connections).
    """
    jq = JobQueue(url, **FAST)
    try:
        jq.migrate()

        @jq.task(name="fuzz.echo", queue=queue)
        def echo(**kwargs: Any) -> dict[str, Any]:
            return {"got": kwargs}

        yield jq
    finally:
        jq.close()


@WORKER_FUZZ
@given(payloads=st.lists(storable_args, min_size=1, max_size=12))
def test_a_worker_runs_whatever_was_accepted(db_url, payloads):
    with echo_queue(db_url, "fuzz-echo") as jq:
        jobs = jq.enqueue_many([("fuzz.echo", payload) for payload in payloads])
        stats = jq.worker(queues=["fuzz-echo"], concurrency=4, burst=True).run()
        assert stats.exit_code == 0
        for job, payload in zip(jobs, payloads, strict=True):
            final = jq.get_job(job.id)
            assert final is not None
            assert final.status == JobStatus.COMPLETED, final.errors
            assert same_json(final.result["got"], payload)


def storable_in_jsonb(text: str) -> bool:
    """Whether PostgreSQL's jsonb accepts ``text`` (strict JSON, no NUL, no
    lone surrogate).
    """

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        value = json.loads(text, parse_constant=refuse)
        json.dumps(value, ensure_ascii=False).encode()  # lone surrogates fail here
    except (ValueError, RecursionError):
        return False
    return "\\u0000" not in text


raw_args = (
    st.builds(json.dumps, json_values)
    | st.text(max_size=20)
    | st.sampled_from(['{"a":', "[]", "1", "", '"x"', "null", '{"a": NaN}', '{"n": 1e999}'])
)


@WORKER_FUZZ
@given(
    raws=st.lists(raw_args, min_size=1, max_size=6),
    tasks=st.lists(st.sampled_from(["fuzz.echo", "fuzz.unknown"]), min_size=6, max_size=6),
)
def test_a_worker_survives_hand_inserted_garbage(db_url, raws, tasks):
    with echo_queue(db_url, "fuzz-raw") as jq:
        pg = jq.url.scheme == "postgresql"
        if pg:
            raws = [raw for raw in raws if storable_in_jsonb(raw)]
        top = max_id(jq)
        # A parameter, not a literal: the garbage may hold a NUL (SQLite
        # stores it; PostgreSQL text cannot, and storable_in_jsonb drops it).
        placeholder = "?::jsonb" if pg else "?"
        for raw, task in zip(raws, tasks, strict=False):
            sql(
                jq,
                "INSERT INTO jobkeeper_jobs (queue, task, args, max_attempts) "
                f"VALUES ('fuzz-raw', '{task}', {placeholder}, 1)",
                (raw,),
            )
        stats = jq.worker(queues=["fuzz-raw"], concurrency=4, burst=True).run()
        assert stats.exit_code == 0
        for job in jq.list_jobs(queue="fuzz-raw", limit=10_000):
            if job.id <= top:
                continue
            assert job.status in (JobStatus.COMPLETED, JobStatus.DEAD), job
            if job.status == JobStatus.DEAD:
                assert job.errors and job.errors[-1]["error"], job
