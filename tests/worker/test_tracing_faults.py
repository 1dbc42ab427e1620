"""Tracing is best-effort: a span processor or exporter that raises never
fails an enqueue that was written (a caller retrying it would enqueue the job
twice) nor costs a job its outcome, on both backends (break-test: an
``on_end`` that raised made ``enqueue`` raise after its commit).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from jobkeeper import JobStatus
from jobkeeper.backends.postgres.plans import COPY_MIN_JOBS
from support.db import sql
from support.waiting import wait_for, wait_status

from .helpers import running

DONE = {JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED}


class Faulty(SpanProcessor):
    """A span processor that raises where it is told to."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Span, parent_context: object = None) -> None:
        if self.where == "on_start":
            raise RuntimeError("on_start failed")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "on_end":
            raise RuntimeError("on_end failed")


def total(jq) -> int:
    return int(sql(jq, "SELECT count(*) FROM jobkeeper_jobs")[0][0])


@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_raising_span_processor_fails_no_enqueue(make_queue, caplog, where):
    provider = TracerProvider()
    provider.add_span_processor(Faulty(where))
    jq = make_queue(tracing=provider)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.tracing"):
        one = jq.enqueue("plain", {"n": 1})
        many = jq.enqueue_many([("plain", {"n": i}) for i in range(3)])
        bulk = jq.enqueue_many([("plain", {"n": i}) for i in range(COPY_MIN_JOBS)])
        by_async = asyncio.run(jq.enqueue_async("plain", {"n": 2}))
        many_async = asyncio.run(jq.enqueue_many_async([("plain", {"n": 3})]))
    # Each call returned what it wrote, and wrote it once.
    written = [one, *many, *bulk, by_async, *many_async]
    assert total(jq) == len(written) == len({job.id for job in written})
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "jobkeeper.tracing"
    ]
    # Once per kind of fault, not once per enqueue.
    assert len(warnings) == 1 and f"{where} failed" in warnings[0], warnings


def test_an_enqueue_that_fails_still_raises_its_own_error(make_queue):
    provider = TracerProvider()
    provider.add_span_processor(Faulty("on_end"))
    jq = make_queue(tracing=provider)
    jq.configure_queue("full", max_pending=1)
    jq.enqueue("plain", {}, queue="full")
    with pytest.raises(Exception, match="max_pending") as info:
        jq.enqueue("plain", {}, queue="full")
    assert type(info.value).__name__ == "QueueFull"
    assert total(jq) == 1


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


def test_an_exception_that_cannot_be_printed_still_ends_its_span(make_queue):
    # Break-test: the SDK's record_exception called str() on it, which
    # raised before span.end(): no process span at all.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    jq = make_queue(tracing=provider)

    @jq.task(max_attempts=1)
    def odd() -> None:
        raise Unprintable

    job = odd.enqueue()
    with running(jq.worker(concurrency=1)):
        wait_status(jq, [job.id], DONE)
        (span,) = wait_for(
            lambda: [s for s in exporter.get_finished_spans() if s.name == "process odd"],
            what="the process span",
        )
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["jobkeeper.job.outcome"] == "dead"
