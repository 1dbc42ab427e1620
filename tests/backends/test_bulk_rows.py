"""The rows of a bulk enqueue (issue "speed round two"): on PostgreSQL the
items of a task given without options share one head (no NewJob per row,
see ``NewJobStream``) and ``{}`` is checked once per task; the Jobs returned
must still be every row's own, field for field, and every refusal the same
as before, named by its item. Run on both backends: SQLite validates a list
of NewJobs, and must give the same answers.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobkeeper import JobQueue, PayloadError
from jobkeeper.models import NewJob, NewJobStream
from support.db import count

BATCH = 300  # past COPY_MIN_JOBS and several of its chunks


def _queue(make_queue: Any, **settings: Any) -> JobQueue:
    jq: JobQueue = make_queue(**settings)

    @jq.task
    def bare() -> None:
        pass

    @jq.task(queue="slow", priority=4, max_attempts=7)
    def needs(x: int, y: int = 1) -> None:
        pass

    @jq.task
    def anything(**kwargs: Any) -> None:
        pass

    return jq


def _mixed_items() -> list[tuple[Any, ...]]:
    """Plain rows of three tasks interleaved and in runs, rows with options
    (a queue, a priority, a delay, an external task) between them."""
    items: list[tuple[Any, ...]] = []
    for i in range(BATCH):
        kind = i % 7
        if kind in (0, 1):
            items.append(("bare", {}))
        elif kind == 2:
            items.append(("needs", {"x": i}))
        elif kind == 3:
            items.append(("anything", {} if i % 2 else {"s": "tab\there \\ back", "n": i}))
        elif kind == 4:
            items.append(("needs", {"x": i, "y": 2}, {"queue": "other", "priority": 1}))
        elif kind == 5:
            items.append(("bare", {}, {"delay": 600}))
        else:
            items.append(("elsewhere", {"i": i}, {"external": True, "max_attempts": 3}))
    return items


def test_every_job_of_a_mixed_bulk_batch_is_its_rows_own(make_queue):
    jq = _queue(make_queue)
    items = _mixed_items()
    jobs = jq.enqueue_many(items)
    assert count(jq) == BATCH
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    for item, job in zip(items, jobs, strict=True):
        assert job.args is item[1]  # the caller's own dict, not a shared one
        stored = jq.get_job(job.id)
        assert stored is not None and stored.to_dict() == job.to_dict()
        assert job.task == item[0]
    assert len({id(job.errors) for job in jobs}) == BATCH
    needs = [
        job for item, job in zip(items, jobs, strict=True) if len(item) == 2 and item[0] == "needs"
    ]
    assert {(job.queue, job.priority, job.max_attempts) for job in needs} == {("slow", 4, 7)}


@pytest.mark.parametrize("position", [0, 1, 150, BATCH - 1])
def test_empty_args_a_task_cannot_take_are_refused_as_a_single_enqueue_refuses_them(
    make_queue, position
):
    jq = _queue(make_queue)
    with pytest.raises(PayloadError) as single:
        jq.enqueue("needs", {})
    items: list[tuple[Any, ...]] = [("needs", {"x": i}) for i in range(BATCH)]
    items[position] = ("needs", {})
    with pytest.raises(PayloadError) as bulk:
        jq.enqueue_many(items)
    assert str(bulk.value) == f"jobs[{position}]: {single.value}"
    items[position] = ("needs", {"x": 1, "z": 2})
    with pytest.raises(
        PayloadError, match=rf"^jobs\[{position}\]: .*unexpected keyword argument 'z'"
    ):
        jq.enqueue_many(items)
    items[position] = ("bare", {"x": 1})
    with pytest.raises(
        PayloadError, match=rf"^jobs\[{position}\]: .*unexpected keyword argument 'x'"
    ):
        jq.enqueue_many(items)
    assert count(jq) == 0


def test_empty_args_past_max_payload_bytes_are_refused_in_a_bulk_batch(make_queue):
    jq = _queue(make_queue, max_payload_bytes=1)
    with pytest.raises(PayloadError) as single:
        jq.enqueue("bare", {})
    with pytest.raises(PayloadError) as bulk:
        jq.enqueue_many([("bare", {})] * BATCH)
    assert str(bulk.value) == f"jobs[0]: {single.value}"
    assert count(jq) == 0


def test_a_stream_makes_no_new_job_per_row(pg_url, monkeypatch):
    """A thousand NewJobs, built and then dropped, were a quarter of a bulk
    enqueue's client time with the garbage collections they set off: the
    rows of a task given without options share its head."""
    from jobkeeper.api import enqueue

    made: list[str] = []
    build = enqueue._plain_new_job

    def counted(*fields: Any) -> NewJob:
        made.append(fields[0])
        return build(*fields)

    monkeypatch.setattr(enqueue, "_plain_new_job", counted)
    with JobQueue(pg_url) as jq:
        jq.migrate()

        @jq.task
        def bare() -> None:
            pass

        @jq.task
        def two(a: int, b: str = "x") -> None:
            pass

        items = [("bare", {}) if i % 3 else ("two", {"a": i}) for i in range(1000)]
        jobs = jq.enqueue_many(items)
        assert len(made) <= 4, f"{len(made)} NewJobs made for 1,000 rows"
        assert [job.args for job in jobs] == [item[1] for item in items]
        assert [job.task for job in jobs] == [item[0] for item in items]
        stored = jq.get_job(jobs[-1].id)
        assert stored is not None and stored.to_dict() == jobs[-1].to_dict()


def test_the_new_jobs_a_stream_gives_are_those_the_constructor_makes(pg_url):
    """Read as a sequence (the paths other than COPY), a row that shares its
    task's head is the NewJob of its own args."""
    with JobQueue(pg_url) as jq:

        @jq.task(queue="q", priority=2, max_attempts=9)
        def two(a: int, b: str = "x") -> None:
            pass

        items = [("two", {"a": i}) for i in range(100)]
        stream = jq._new_jobs(items)
        assert isinstance(stream, NewJobStream)
        expected = [
            NewJob(task="two", args_json=f'{{"a":{i}}}', args={"a": i}, queue="q", priority=2,
                   max_attempts=9)
            for i in range(100)
        ]  # fmt: skip
        assert stream[50] == expected[50] and stream[-1] == expected[-1]
        assert list(stream) == expected
        assert all(new.args is item[1] for new, item in zip(stream, items, strict=True))
