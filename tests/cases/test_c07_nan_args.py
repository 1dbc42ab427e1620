"""C-07: NaN/Infinity in args becomes an unloadable poison job (sidekiq#3294).

Non-JSON numbers are refused at every way in (the Python API, sync and async,
in the caller's transaction, a batch with one bad job, the CLI), with an
error naming the path and the value and nothing written. A row written
outside enqueue, with args that cannot be loaded, is read back and claimed
without raising, and a real worker records a clear deserialization error and
dead-letters it (its args are the same at every attempt) while it goes on.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from typing import Any

import psycopg
import pytest

from backends.helpers import claim, total_rows
from cli.helpers import assert_one_line_error, run_module
from jobkeeper import JobQueue, JobStatus, PayloadError
from support.cli import Cli
from support.db import is_pg, sql

NON_FINITE = [
    ({"x": math.nan}, "args.x", "nan"),
    ({"x": math.inf}, "args.x", "inf"),
    ({"x": -math.inf}, "args.x", "-inf"),
    ({"a": [1, {"b": math.nan}]}, "args.a[1].b", "nan"),
]


def own_connection(jq: JobQueue) -> Any:
    """A connection of the caller's own to the queue's database."""
    if is_pg(jq):
        return psycopg.connect(jq.url.url)
    return sqlite3.connect(jq.url.path)


@pytest.mark.parametrize(("args", "path", "shown"), NON_FINITE)
def test_c07_python_api_refuses_naming_path_and_value(jq, args, path, shown):
    @jq.task(name="t")
    def anything(**kwargs: Any) -> None: ...

    attempts = {
        "enqueue": lambda: jq.enqueue("t", args),
        "task.enqueue": lambda: anything.enqueue(**args),
        "task.options": lambda: anything.options(delay=5, priority=1).enqueue(**args),
        "enqueue_async": lambda: asyncio.run(jq.enqueue_async("t", args)),
    }
    for way, call in attempts.items():
        with pytest.raises(PayloadError) as info:
            call()
        assert str(info.value).startswith(f"{path}: {shown} is not a JSON number"), way
    conn = own_connection(jq)
    try:
        with pytest.raises(PayloadError) as info:
            jq.enqueue("t", args, connection=conn)
        assert str(info.value).startswith(f"{path}: {shown} is not a JSON number")
        conn.commit()
    finally:
        conn.close()
    assert total_rows(jq) == 0


@pytest.mark.parametrize(("args", "path", "shown"), NON_FINITE)
def test_c07_batch_of_ten_with_one_bad_job_inserts_nothing(jq, args, path, shown):
    batch = [("t", {"i": i, "ok": 1.5}) for i in range(10)]
    batch[7] = ("t", args)
    with pytest.raises(PayloadError) as info:
        jq.enqueue_many(batch)
    assert str(info.value).startswith(f"jobs[7]: {path}: {shown} ")
    with pytest.raises(PayloadError) as info:
        asyncio.run(jq.enqueue_many_async(batch))
    assert str(info.value).startswith(f"jobs[7]: {path}: {shown} ")
    assert total_rows(jq) == 0


CLI_NON_FINITE = [
    ('{"x": NaN}', "args.x", "NaN"),
    ('{"x": Infinity}', "args.x", "Infinity"),
    ('{"x": -Infinity}', "args.x", "-Infinity"),
    ('{"a": [1, {"b": NaN}]}', "args.a[1].b", "NaN"),
    ('{"a": [1, {"b": 1e999}]}', "args.a[1].b", "1e999"),
    ('{"x": -1e400}', "args.x", "-1e400"),
    # A long literal keeps its exponent (break-test 16: cut at 40 characters
    # it named a number that is not too large).
    (
        '{"x": ' + "1" * 43 + "e300}",
        "args.x",
        "1111111111111111...111111111111e300 (47 characters)",
    ),
]


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    runner = Cli(db_url, capsys)
    runner.ok("migrate")
    return runner


@pytest.mark.parametrize(("text", "path", "shown"), CLI_NON_FINITE)
def test_c07_cli_exits_2_naming_path_and_value(cli, text, path, shown):
    code, out, err = cli("enqueue", "t", "--args", text)
    assert code == 2, err
    assert_one_line_error(err, f"--args: {path} is {shown}")
    assert out == ""
    with JobQueue(cli.url) as jq:
        assert total_rows(jq) == 0


def test_c07_cli_entry_point_exits_2(cli):
    done = run_module("--database", cli.url, "enqueue", "t", "--args", '{"a": [1, {"b": NaN}]}')
    assert done.returncode == 2, done.stderr
    assert_one_line_error(done.stderr, "args.a[1].b", "NaN")
    assert done.stdout == ""
    with JobQueue(cli.url) as jq:
        assert total_rows(jq) == 0


# -- rows written outside enqueue ------------------------------------------------------------


def insert_raw_args(
    jq: JobQueue, raw: str, *, task: str = "t", max_attempts: int = 20, pg_type: str = "jsonb"
) -> int:
    """A row written outside jobkeeper (by hand, by another tool) with ``raw``
    args; on PostgreSQL parsed as ``pg_type`` first (``json`` keeps the text
    as written, escapes and exponents included; ``jsonb`` normalises it).
    """
    cast = f"?::{pg_type}" if is_pg(jq) else "?"
    sql(
        jq,
        "INSERT INTO jobkeeper_jobs (queue, task, args, max_attempts) "
        f"VALUES ('default', ?, {cast}, ?)",
        (task, raw, max_attempts),
    )
    return int(sql(jq, "SELECT max(id) FROM jobkeeper_jobs")[0][0])


#: Valid JSON on both backends that Python's json cannot load: nested deeper
#: than its recursion limit.
TOO_DEEP = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"


def raw_args_cases(jq: JobQueue) -> list[str]:
    if is_pg(jq):
        # jsonb parses strictly: what can go wrong is a non-object, or a
        # number no Python int or float holds (json.loads refuses 5001 digits).
        return ["[1, 2]", '"just text"', "null", "42", '{"x": 1e5000}', TOO_DEEP]
    return [
        TOO_DEEP,
        "not json",
        '{"x": NaN}',
        '{"a": [1, {"b": -Infinity}]}',
        '{"n": 1e999}',
        "[1, 2]",
        '{"unterminated": ',
        "",
    ]


def test_c07_hand_inserted_unparseable_args_never_raise_on_read_or_claim(jq):
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


def recording_queue(make_queue: Any, *, limited: bool) -> tuple[JobQueue, list[dict[str, Any]]]:
    """A queue with task ``t`` (5 attempts), which records the args it gets;
    ``limited``: its queue has a concurrency cap.
    """
    jq = make_queue()
    if limited:
        # Queues with limits claim through their own path (backends/*/flow.py).
        jq.configure_queue("default", concurrency=5)
    ran: list[dict[str, Any]] = []

    @jq.task(max_attempts=5)
    def t(**kwargs: Any) -> None:
        ran.append(kwargs)

    return jq, ran


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited-queue"])
def test_c07_a_real_worker_dead_letters_unloadable_rows_and_goes_on(make_queue, limited):
    jq, ran = recording_queue(make_queue, limited=limited)
    raws = raw_args_cases(jq)
    bad = [insert_raw_args(jq, raw, max_attempts=5) for raw in raws]
    good = jq.enqueue("t", {"fine": True})
    stats = jq.worker(concurrency=2, burst=True).run()
    assert stats.exit_code == 0
    assert ran == [{"fine": True}]  # the task never saw the bad rows
    done = jq.get_job(good.id)
    assert done is not None and done.status == JobStatus.COMPLETED
    for job_id, raw in zip(bad, raws, strict=True):
        dead = jq.get_job(job_id)
        assert dead is not None, raw
        assert dead.status == JobStatus.DEAD, (raw, dead)
        assert dead.attempt == 1, raw
        (entry,) = dead.errors
        assert entry["error"].startswith("cannot run job: stored args"), raw
        assert "written outside jobkeeper's enqueue" in (dead.dead_reason or ""), raw
    assert total_rows(jq) == len(raws) + 1


#: Loadable by json.loads, refused by enqueue: a float that overflows with a
#: short exponent (300 mantissa digits), nesting past MAX_DEPTH (64), NUL and
#: a lone surrogate escaped. A break-test found each reaching the task: the
#: first two past the old text check, all of them on a queue with limits,
#: whose claim decodes args in the driver.
REFUSED_BY_ENQUEUE = [
    ('{"x": 2' + "0" * 300 + "e8}", "args.x: inf"),
    ('{"a": ' + "[" * 69 + "]" * 69 + "}", "nested deeper than 64"),
    ('{"x": "a\\u0000b"}', "args.x"),
    ('{"x": "\\ud800"}', "args.x"),
]


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited-queue"])
def test_c07_stored_args_enqueue_would_refuse_never_reach_the_task(make_queue, limited):
    jq, ran = recording_queue(make_queue, limited=limited)
    bad = [
        insert_raw_args(jq, raw, max_attempts=5, pg_type="json") for raw, _ in REFUSED_BY_ENQUEUE
    ]
    assert jq.worker(concurrency=2, burst=True).run().exit_code == 0
    assert ran == []
    for job_id, (raw, shown) in zip(bad, REFUSED_BY_ENQUEUE, strict=True):
        dead = jq.get_job(job_id)
        assert dead is not None and dead.status == JobStatus.DEAD, raw[:40]
        (entry,) = dead.errors
        assert entry["error"].startswith("cannot run job: stored args are not valid job args")
        assert shown in entry["error"], (raw[:40], entry["error"])


def test_c07_the_dead_letter_names_the_path_of_a_stored_nan(make_queue):
    jq = make_queue()

    @jq.task
    def t(**kwargs: Any) -> None: ...

    # On PostgreSQL jsonb cannot hold NaN: what reaches the worker is a
    # number beyond Python's; on SQLite the text holds the literal itself.
    raw = '{"a": [1, {"b": NaN}]}' if not is_pg(jq) else '{"a": [1, {"b": 1e5000}]}'
    job_id = insert_raw_args(jq, raw)
    assert jq.worker(burst=True).run().exit_code == 0
    dead = jq.get_job(job_id)
    assert dead is not None and dead.status == JobStatus.DEAD
    error = dead.errors[0]["error"]
    if is_pg(jq):
        assert "not valid JSON" in error and "4300" in error
    else:
        assert "args.a[1].b: nan" in error


def test_c07_an_unloadable_row_returned_as_a_duplicate_does_not_fail_the_enqueue(jq):
    """enqueue with a unique_key returns the pending job of that key, which
    may be a row written by hand, also through the caller's own connection."""
    job_id = insert_raw_args(jq, TOO_DEEP)
    sql(jq, "UPDATE jobkeeper_jobs SET unique_key = 'k' WHERE id = ?", (job_id,))
    found = jq.enqueue("t", {}, unique_key="k")
    assert found.id == job_id and found.args is None and found.args_error
    conn = own_connection(jq)
    try:
        found = jq.enqueue("t", {}, unique_key="k", connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert found.id == job_id and found.args is None and found.args_error
    if is_pg(jq):

        async def in_caller_transaction() -> Any:
            async with await psycopg.AsyncConnection.connect(jq.url.url) as aconn:
                return await jq.enqueue_async("t", {}, unique_key="k", connection=aconn)

        found = asyncio.run(in_caller_transaction())
        assert found.id == job_id and found.args is None and found.args_error
    assert total_rows(jq) == 1
