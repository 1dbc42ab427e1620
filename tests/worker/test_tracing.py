"""OpenTelemetry tracing (``JobQueue(tracing=...)``): an enqueue span per
call, a process span per attempt that continues the enqueuer's trace, on both
backends, with a real worker on a thread and the SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from jobkeeper import ConfigError, JobQueue, JobStatus, Snooze
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for, wait_status

from .helpers import running

DONE = {JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    # A provider of the test's own: the global one can be set only once a process.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
def tq(make_queue, provider) -> JobQueue:
    """A migrated queue on each backend, tracing into ``provider``."""
    return make_queue(tracing=provider)


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def wait_spans(exporter: InMemorySpanExporter, name: str, count: int) -> list[ReadableSpan]:
    return wait_for(
        lambda: (found := spans(exporter, name)) and len(found) >= count and found,
        what=f"{count} {name!r} spans",
    )


def stored_context(jq: JobQueue, job_id: int) -> str | None:
    rows = sql(jq, "SELECT trace_context FROM jobkeeper_jobs WHERE id = ?", (job_id,))
    return rows[0][0]


def test_the_execution_continues_the_enqueuers_trace(tq, provider, exporter):
    tracer = provider.get_tracer("test")

    @tq.task
    def greet(name: str) -> str:
        with tracer.start_as_current_span("inside the task"):
            return f"hello {name}"

    with tracer.start_as_current_span("request") as request:
        job = greet.enqueue(name="ada")
    # The context travels in its own column: the task's args are untouched.
    stored = tq.get_job(job.id)
    assert stored is not None and stored.args == {"name": "ada"}
    carrier = json.loads(stored.trace_context or "")
    assert carrier["traceparent"].split("-")[1] == f"{request.get_span_context().trace_id:032x}"

    with running(tq.worker(concurrency=2)):
        wait_status(tq, [job.id], DONE)
        (process,) = wait_spans(exporter, "process greet", 1)
    (enqueue,) = spans(exporter, "enqueue greet")
    (inner,) = spans(exporter, "inside the task")
    caller = request.get_span_context()
    assert enqueue.context.trace_id == process.context.trace_id == caller.trace_id
    assert enqueue.parent is not None and enqueue.parent.span_id == caller.span_id
    # A child of the enqueue span (not a link), and the task's own spans nest under it.
    assert process.parent is not None and process.parent.span_id == enqueue.context.span_id
    assert inner.parent is not None and inner.parent.span_id == process.context.span_id
    assert (enqueue.kind, process.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert enqueue.attributes is not None and process.attributes is not None
    assert dict(enqueue.attributes) == {
        "messaging.system": "jobkeeper",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.id),
        "jobkeeper.job.task": "greet",
    }
    attributes = dict(process.attributes)
    assert attributes.pop("jobkeeper.worker.id")
    assert attributes == {
        "messaging.system": "jobkeeper",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.id),
        "jobkeeper.job.task": "greet",
        "jobkeeper.job.attempt": 1,
        "jobkeeper.job.max_attempts": 20,
        "jobkeeper.job.outcome": "completed",
    }
    assert process.status.status_code is StatusCode.UNSET and not process.events


def test_a_failure_is_recorded_and_each_attempt_has_its_span(tq, exporter):
    @tq.task(max_attempts=3, backoff=lambda attempt, error: 0)
    def broken() -> None:
        raise ValueError("the disk is full")

    job = broken.enqueue()
    with running(tq.worker(concurrency=1)):
        wait_status(tq, [job.id], {JobStatus.DEAD})
        attempts = wait_spans(exporter, "process broken", 3)
    (enqueue,) = spans(exporter, "enqueue broken")
    attempts.sort(key=lambda s: s.attributes["jobkeeper.job.attempt"])  # type: ignore[index]
    assert [s.attributes["jobkeeper.job.attempt"] for s in attempts] == [1, 2, 3]  # type: ignore[index]
    assert [s.attributes["jobkeeper.job.outcome"] for s in attempts] == [  # type: ignore[index]
        "retried",
        "retried",
        "dead",
    ]
    for span in attempts:
        assert span.context.trace_id == enqueue.context.trace_id
        assert span.parent is not None and span.parent.span_id == enqueue.context.span_id
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError: the disk is full"
        (event,) = span.events
        assert event.name == "exception" and event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == "the disk is full"
        assert "raise ValueError" in str(event.attributes["exception.stacktrace"])


def test_a_snooze_is_no_error(tq, exporter):
    @tq.task
    def later() -> str:
        from jobkeeper import current_job

        if not current_job().errors and not getattr(later, "snoozed", False):
            later.snoozed = True  # type: ignore[attr-defined]
            raise Snooze(0)
        return "done"

    job = later.enqueue()
    with running(tq.worker(concurrency=1)):
        wait_status(tq, [job.id], DONE)
        found = wait_spans(exporter, "process later", 2)
    outcomes = sorted(s.attributes["jobkeeper.job.outcome"] for s in found)  # type: ignore[index]
    assert outcomes == ["completed", "snoozed"]
    assert all(s.status.status_code is StatusCode.UNSET and not s.events for s in found)


def test_enqueue_many_is_one_span_parent_of_every_execution(tq, exporter):
    @tq.task
    def add(x: int) -> int:
        return x + 1

    jobs = tq.enqueue_many([(add, {"x": i}) for i in range(3)])
    (enqueue,) = spans(exporter, "enqueue add")
    assert enqueue.attributes is not None
    assert enqueue.attributes["messaging.batch.message_count"] == 3
    assert enqueue.attributes["messaging.operation.name"] == "enqueue_many"
    assert "messaging.message.id" not in enqueue.attributes
    with running(tq.worker(concurrency=3)):
        wait_status(tq, [j.id for j in jobs], DONE)
        found = wait_spans(exporter, "process add", 3)
    assert sorted(s.attributes["messaging.message.id"] for s in found) == sorted(  # type: ignore[index]
        str(j.id) for j in jobs
    )
    assert all(s.parent is not None and s.parent.span_id == enqueue.context.span_id for s in found)


def test_the_bulk_insert_path_carries_the_context(tq, exporter):
    # 64 jobs and more take the COPY path on PostgreSQL, executemany on SQLite.
    jobs = tq.enqueue_many([("bulk", {"n": i}) for i in range(70)])
    (enqueue,) = spans(exporter, "enqueue bulk")
    texts = {stored_context(tq, j.id) for j in (jobs[0], jobs[-1])}
    (text,) = texts
    assert text is not None
    assert f"{enqueue.context.span_id:016x}" in json.loads(text)["traceparent"]


def test_async_enqueues_and_async_tasks(tq, provider, exporter):
    tracer = provider.get_tracer("test")

    @tq.task
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        with tracer.start_as_current_span("inside the async task"):
            await asyncio.sleep(0)
        return url

    async def enqueue() -> list[int]:
        one = await tq.enqueue_async(fetch, {"url": "a"})
        many = await tq.enqueue_many_async([(fetch, {"url": "b"}), (fetch, {"url": "c"})])
        await tq.aclose()
        return [one.id, *(j.id for j in many)]

    ids = asyncio.run(enqueue())
    single = spans(exporter, "enqueue fetch")
    assert len(single) == 2
    by_operation = {s.attributes["messaging.operation.name"]: s for s in single}  # type: ignore[index]
    assert by_operation["enqueue"].attributes["messaging.message.id"] == str(ids[0])  # type: ignore[index]
    with running(tq.worker(concurrency=3)):
        wait_status(tq, ids, DONE)
        found = wait_spans(exporter, "process fetch", 3)
    inner = spans(exporter, "inside the async task")
    assert len(inner) == 3
    by_id = {s.attributes["messaging.message.id"]: s for s in found}  # type: ignore[index]
    assert by_id[str(ids[0])].parent.span_id == by_operation["enqueue"].context.span_id  # type: ignore[union-attr]
    for job_id in ids[1:]:
        assert by_id[str(job_id)].parent.span_id == by_operation["enqueue_many"].context.span_id  # type: ignore[union-attr]
    process_ids = {s.context.span_id for s in found}
    assert {s.parent.span_id for s in inner} == process_ids  # type: ignore[union-attr]
    assert all(s.attributes["jobkeeper.job.outcome"] == "completed" for s in found)  # type: ignore[index]


def test_a_job_without_context_starts_a_trace_of_its_own(tq, make_queue, exporter):
    # Enqueued by a queue without tracing (or a version before it), or with
    # a context written outside jobkeeper that cannot be read: the execution
    # is a root span, and the job runs as ever.
    plain = make_queue()
    first = plain.enqueue("noop", {})
    second = plain.enqueue("noop", {})
    sql(tq, "UPDATE jobkeeper_jobs SET trace_context = 'not json' WHERE id = ?", (second.id,))
    assert stored_context(tq, first.id) is None

    @tq.task
    def noop() -> None:
        return None

    with running(tq.worker(concurrency=1)):
        wait_status(tq, [first.id, second.id], DONE)
        found = wait_spans(exporter, "process noop", 2)
    assert all(s.parent is None for s in found)
    assert len({s.context.trace_id for s in found}) == 2


def test_tracing_off_stores_no_context_and_makes_no_span(jq, provider, exporter):
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("request"):
        job = jq.enqueue("plain", {})
        (many,) = jq.enqueue_many([("plain", {})])
    assert stored_context(jq, job.id) is None and stored_context(jq, many.id) is None
    assert [s.name for s in exporter.get_finished_spans()] == ["request"]


def test_a_provider_that_records_nothing_stores_no_context(make_queue):
    # The API without an SDK behaves so: spans are no-ops, nothing to carry.
    jq = make_queue(tracing=trace.NoOpTracerProvider())
    job = jq.enqueue("plain", {})
    assert stored_context(jq, job.id) is None


def test_tracing_refuses_what_is_not_a_provider(tmp_path):
    with pytest.raises(ConfigError, match="TracerProvider"):
        JobQueue(f"sqlite:///{tmp_path / 'x.db'}", tracing="yes", **FAST)


def test_a_limited_queue_claims_the_context_too(tq, exporter):
    # Queues with settings claim through another statement
    # (jobkeeper_claim_limited on PostgreSQL, the serial claim on SQLite).
    tq.configure_queue("capped", concurrency=2)

    @tq.task(queue="capped")
    def capped(n: int) -> int:
        return n

    jobs = [capped.enqueue(n=1), capped.options(serial_key="k").enqueue(n=2)]
    with running(tq.worker(["capped"], concurrency=2)):
        wait_status(tq, [j.id for j in jobs], DONE)
        found = wait_spans(exporter, "process capped", 2)
    enqueues = {s.attributes["messaging.message.id"]: s for s in spans(exporter, "enqueue capped")}  # type: ignore[index]
    for span in found:
        parent = enqueues[span.attributes["messaging.message.id"]]  # type: ignore[index]
        assert span.parent is not None and span.parent.span_id == parent.context.span_id
