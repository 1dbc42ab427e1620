"""OpenTelemetry tracing (``pip install 'jobkeeper[otel]'``; turned on with
``JobQueue(..., tracing=True)``).

Two spans per job, described by the OpenTelemetry messaging semantic
conventions (``messaging.system = "jobkeeper"``); their names carry the task
where the conventions' ``{operation} {destination}`` would put the queue (the
task says what the job does; the queue is ``messaging.destination.name``):

- ``enqueue <task>`` (kind PRODUCER, ``messaging.operation.type = "send"``)
  around each ``enqueue`` / ``enqueue_many`` (sync and async): one span per
  call, whatever the number of jobs. With the span current, the global
  propagator (W3C ``traceparent``/``tracestate`` and ``baggage`` unless
  ``OTEL_PROPAGATORS`` says otherwise) injects the trace context into a
  carrier dict, stored as JSON text in the job's ``trace_context`` column
  (:attr:`jobkeeper.Job.trace_context`), never in its args.
- ``process <task>`` (kind CONSUMER, ``messaging.operation.type =
  "process"``) around each attempt in a worker: a *child* of the enqueue
  span, so every attempt of a job (retries included) continues the trace of
  the code that enqueued it. A child rather than a link because each
  execution handles exactly one job, the case where the conventions ask for
  the creation context as parent; links are for batch receives. The span is
  current while the task runs, so spans its code makes (HTTP calls, SQL)
  nest under it. It ends when the attempt's outcome is decided, with
  ``jobkeeper.job.outcome`` (``completed``, ``retried``, ``dead``,
  ``cancelled``, ``snoozed``, ``released``: the values of
  :class:`~jobkeeper.OutcomeKind`), status ERROR on ``retried`` and
  ``dead``, and the exception the code raised recorded as a span event.

The worker side is a listener of the event seam (:mod:`jobkeeper.events`),
as the job logs and metrics are: the span starts at STARTED and ends at
FINISHED, which the executor emits on the thread (or asyncio task) that
runs the attempt. With tracing off (the default) nothing here is imported,
no listener is subscribed and no context is injected: the enqueue and
claim paths write and read a NULL column, and that is all.

Only ``opentelemetry-api`` is imported; the application installs and sets
up the SDK (a tracer provider and exporters). Without one, the API's spans
are non-recording no-ops and no context is stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from jobkeeper.events import EventKind, JobEvent, OutcomeKind
from jobkeeper.models import Job, NewJob
from jobkeeper.version import __version__

logger = logging.getLogger("jobkeeper.tracing")

#: ``messaging.system`` of every jobkeeper span.
MESSAGING_SYSTEM = "jobkeeper"
#: Outcomes that set the execution span's status to ERROR and record what
#: the code raised (a cancel or a shutdown also raises in the code, to stop
#: it, but is no failure of the job).
FAILED_OUTCOMES = frozenset({OutcomeKind.RETRIED, OutcomeKind.DEAD})


def _carrier_text(carrier: dict[str, str]) -> str | None:
    return json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else None


def _carrier_of(text: str | None) -> dict[str, str]:
    """The carrier stored with a job; a malformed one (written outside
    jobkeeper) is ignored, never a reason to fail the job.
    """
    if not text:
        return {}
    try:
        decoded = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {str(k): v for k, v in decoded.items() if isinstance(v, str)}


class Tracing:
    """Spans for one :class:`~jobkeeper.JobQueue`'s enqueues and the
    executions of its workers (internal: made by ``JobQueue(tracing=...)``).

    Args:
        tracer_provider: an OpenTelemetry ``TracerProvider``; ``None`` uses
            the global one (``opentelemetry.trace.set_tracer_provider``),
            looked up at each span so one set after the queue is made counts.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (the ``otel`` extra).
    """

    #: The events the worker side listens to.
    kinds = frozenset({EventKind.STARTED, EventKind.FINISHED})

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import context, propagate, trace

        self._trace = trace
        self._context = context
        self._propagate = propagate
        self._tracer = trace.get_tracer("jobkeeper", __version__, tracer_provider=tracer_provider)
        # (job id, fence) -> (span, context token) of each running attempt.
        self._running: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[str, type[BaseException]]] = set()

    def failed(self, step: str, exc: Exception) -> None:
        """A tracing call (the SDK's, a span processor's, an exporter's)
        raised during ``step``: logged at WARNING once per step and kind of
        error (the same fault repeats at every job), then at DEBUG. Tracing
        is best-effort: it never fails an enqueue or a job, nor makes an
        enqueue that was written look failed (a retry would enqueue the job
        twice).
        """
        key = (step, type(exc))
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        # A repr or a log handler that raises: nothing more to say.
        with contextlib.suppress(Exception):
            logger.log(level, "%s failed (spans may be missing): %r", step, exc)

    # -- producer side ------------------------------------------------------------

    def enqueue_span(self, jobs: Sequence[NewJob], *, batch: bool) -> EnqueueSpan:
        """A context manager: the span of one enqueue call writing ``jobs``
        (``batch``: an ``enqueue_many``). Its ``jobs`` carry the context.
        """
        return EnqueueSpan(self, jobs, batch=batch)

    # -- worker side (an event listener) ------------------------------------------

    def __call__(self, event: JobEvent) -> None:
        """Start (STARTED) or end (FINISHED) an attempt's span."""
        job = event.job
        if job is None:
            return
        try:
            if event.kind is EventKind.STARTED:
                self._start(job, event.worker_id)
            elif event.kind is EventKind.FINISHED:
                self._end(job, event)
        except Exception as exc:  # noqa: BLE001 - any fault of the SDK or its plugins
            step = "starting" if event.kind is EventKind.STARTED else "ending"
            self.failed(f"{step} a process span", exc)

    def _start(self, job: Job, worker_id: str | None) -> None:
        # An empty base context: the runner thread's own context (what a
        # previous attempt may have left) must never become the parent.
        parent = self._propagate.extract(
            _carrier_of(job.trace_context), context=self._context.Context()
        )
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "jobkeeper.job.task": job.task,
            "jobkeeper.job.attempt": job.attempt,
            "jobkeeper.job.max_attempts": job.max_attempts,
        }
        if worker_id is not None:
            attributes["jobkeeper.worker.id"] = worker_id
        span = self._tracer.start_span(
            f"process {job.task}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            attributes=attributes,
        )
        # Current while the task runs: its own spans nest under this one.
        token = self._context.attach(self._trace.set_span_in_context(span, parent))
        with self._lock:
            self._running[(job.id, job.fence)] = (span, token)

    def _end(self, job: Job, event: JobEvent) -> None:
        with self._lock:
            entry = self._running.pop((job.id, job.fence), None)
        if entry is None:
            return  # handed back or cancelled before it started: no span
        span, token = entry
        try:
            outcome = event.outcome
            if outcome is not None:
                span.set_attribute("jobkeeper.job.outcome", outcome.value)
            if outcome in FAILED_OUTCOMES:
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, event.error))
                if event.exception is not None:
                    # The SDK formats the exception (str(), its traceback):
                    # an exception whose __str__ raises must not cost the span.
                    try:
                        span.record_exception(event.exception)
                    except Exception as exc:  # noqa: BLE001 - any fault of the SDK or its plugins
                        self.failed("recording the exception of a process span", exc)
        finally:
            try:
                span.end()
            finally:
                self._context.detach(token)


class EnqueueSpan:
    """The span of one enqueue call (see :meth:`Tracing.enqueue_span`).

    Used as ``with tracing.enqueue_span(jobs, batch=False) as span:``, then
    ``span.jobs`` (the jobs with the context to store) are written and
    ``span.stored(jobs)`` names what was written. An exception leaving the
    block is recorded and sets status ERROR. Works in sync and async code
    alike (the span is current inside the block).
    """

    def __init__(self, tracing: Tracing, jobs: Sequence[NewJob], *, batch: bool) -> None:
        self._tracing = tracing
        self._new = jobs
        self._batch = batch
        self._span: Any = None
        self._token: Any = None
        self.jobs: Sequence[NewJob] = jobs

    def __enter__(self) -> EnqueueSpan:
        try:
            self._open()
        except Exception as exc:  # noqa: BLE001 - any fault of the SDK or its plugins
            self._tracing.failed("starting an enqueue span", exc)
            self._close()
            self.jobs = self._new
        return self

    def _open(self) -> None:
        tracing = self._tracing
        queues = {job.queue for job in self._new}
        tasks = {job.task for job in self._new}
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue_many" if self._batch else "enqueue",
        }
        if len(queues) == 1:
            attributes["messaging.destination.name"] = next(iter(queues))
        if len(tasks) == 1:
            attributes["jobkeeper.job.task"] = next(iter(tasks))
        if self._batch:
            attributes["messaging.batch.message_count"] = len(self._new)
        name = f"enqueue {next(iter(tasks))}" if len(tasks) == 1 else "enqueue"
        self._span = tracing._tracer.start_span(
            name, kind=tracing._trace.SpanKind.PRODUCER, attributes=attributes
        )
        self._token = tracing._context.attach(tracing._trace.set_span_in_context(self._span))
        carrier: dict[str, str] = {}
        tracing._propagate.inject(carrier)
        text = _carrier_text(carrier)
        if text is not None:
            self.jobs = [_with_context(job, text) for job in self._new]

    def stored(self, jobs: Sequence[Job]) -> None:
        """Name what was written (the id of a single job)."""
        if len(jobs) == 1 and not self._batch and self._span is not None:
            try:
                self._span.set_attribute("messaging.message.id", str(jobs[0].id))
            except Exception as exc:  # noqa: BLE001 - any fault of the SDK or its plugins
                self._tracing.failed("naming an enqueue span's job", exc)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Whatever the span does, the block's own outcome stands: the jobs
        # are written (or not) by now, and an error here must not say otherwise.
        try:
            if exc is not None and self._span is not None:
                trace = self._tracing._trace
                self._span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
                self._span.record_exception(exc)
        except Exception as error:  # noqa: BLE001 - any fault of the SDK or its plugins
            self._tracing.failed("recording an enqueue's error", error)
        self._close()

    def _close(self) -> None:
        """End the span and restore the caller's context (each best-effort)."""
        span, token = self._span, self._token
        self._span = self._token = None
        if span is not None:
            try:
                span.end()
            except Exception as exc:  # noqa: BLE001 - any fault of the SDK or its plugins
                self._tracing.failed("ending an enqueue span", exc)
        if token is not None:
            try:
                self._tracing._context.detach(token)
            except Exception as exc:  # noqa: BLE001 - any fault of the SDK or its plugins
                self._tracing.failed("restoring the context after an enqueue span", exc)


def _with_context(job: NewJob, text: str) -> NewJob:
    return dataclasses.replace(job, trace_context=text)
