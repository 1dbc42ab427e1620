"""A task's result may hold tuples, stored as JSON arrays (break-test: a task
returning ``(1, 2)`` went to the dead letters after its side effects ran,
"result: (1, 2) is a tuple, not a JSON value"). What has no JSON form (a
set, NaN, an object) is still refused, and args still refuse tuples.
"""

from __future__ import annotations

import sqlite3
from collections import namedtuple
from typing import Any

import psycopg
import pytest

from jobkeeper import JobQueue, PayloadError, complete_in
from jobkeeper.models import JobStatus
from jobkeeper.testing import drain
from support.db import is_pg, job

Point = namedtuple("Point", "x y")


def test_tuples_in_results_are_stored_as_arrays(make_queue: Any) -> None:
    jq: JobQueue = make_queue()
    ran: list[str] = []

    @jq.task(max_attempts=3)
    def pair() -> tuple[int, str]:
        ran.append("pair")
        return 1, "a"

    @jq.task()
    def nested() -> Any:
        return {"rows": [(1, (2.5, None)), ()], "point": Point(3, 4)}

    @jq.task()
    async def async_pair() -> tuple[bool, list[int]]:
        return True, [1]

    jobs = [pair.enqueue(), nested.enqueue(), async_pair.enqueue()]
    assert drain(jq) == {"completed": 3}
    assert ran == ["pair"]  # once: no retry, no dead letter
    results = [job(jq, j.id).result for j in jobs]
    assert results == [
        [1, "a"],
        {"rows": [[1, [2.5, None]], []], "point": [3, 4]},
        [True, [1]],
    ]
    # A waiter gets the list back, as stored.
    assert jq.wait(jobs[0].id, timeout=10) == [1, "a"]
    assert type(jq.wait(jobs[2].id, timeout=10)) is list


def test_a_tuple_does_not_make_an_unstorable_value_storable(make_queue: Any) -> None:
    jq: JobQueue = make_queue()

    @jq.task(max_attempts=5)
    def with_a_set() -> Any:
        return (1, {2, 3})

    @jq.task(max_attempts=5)
    def with_nan() -> Any:
        return {"a": [(1.0, float("nan"))]}

    ids = [with_a_set.enqueue().id, with_nan.enqueue().id]
    assert drain(jq) == {"dead": 2}
    errors = [job(jq, job_id).errors[0]["error"] for job_id in ids]
    assert "result not storable: result[1]: {2, 3} is a set" in errors[0]
    assert "result not storable: result.a[0][1]: nan is not a JSON number" in errors[1]
    assert all(job(jq, job_id).status == JobStatus.DEAD for job_id in ids)


def test_complete_in_takes_a_tuple_result(make_queue: Any) -> None:
    jq: JobQueue = make_queue()

    @jq.task()
    def settle() -> None:
        if is_pg(jq):
            with psycopg.connect(jq.url.url) as conn:
                complete_in(conn, result=("paid", (7, 9)))
        else:
            conn = sqlite3.connect(jq.url.path)
            try:
                complete_in(conn, result=("paid", (7, 9)))
                conn.commit()
            finally:
                conn.close()

    done = settle.enqueue()
    assert drain(jq) == {"completed": 1}
    assert job(jq, done.id).result == ["paid", [7, 9]]


def test_args_still_refuse_tuples(make_queue: Any) -> None:
    jq: JobQueue = make_queue()

    @jq.task()
    def takes(values: Any) -> None: ...

    with pytest.raises(PayloadError, match=r"args\.values: \(1, 2\) is a tuple"):
        takes.enqueue(values=(1, 2))
    assert jq.stats() == {}
