"""Per-worker Prometheus metrics: what this worker processed, from the event
seam (``pip install 'jobkeeper[metrics]'``; ``jobkeeper worker --metrics-port N``).

- ``jobkeeper_jobs_processed_total{queue,task,outcome}``: attempts this worker
  ended, by the outcome the database accepted (counted once written):
  ``completed``, ``retried``, ``dead``, ``cancelled``, ``snoozed``,
  ``released`` (handed back, attempt not spent; prefetched jobs included), and
  ``claim_lost``: the outcome was refused, as the job had been rescued from
  this worker while it was silent (another worker's outcome counts instead). A job of a task
  the worker does not register counts under ``task="(unregistered)"``: a task
  name is any text a producer stored, and one label value each would let
  them grow the metrics without bound.
- ``jobkeeper_job_duration_seconds{queue,task}``: a histogram of every
  attempt that ran (not of jobs handed back before they started).
- ``jobkeeper_rescues_total``: jobs this worker's rescuer took back from
  silent holders.

Queue-level gauges (jobs per status, the oldest due job, workers) are read
from the database by the dashboard's ``/metrics``; a worker reports only
what it did. The listener is one of the event seam's subscribers (like the
job logs): nothing in the worker knows metrics exist, and with no metrics
port nothing is counted at all. Oban's telemetry metrics are the model
(``oban-bg/oban:lib/oban/telemetry.ex``).
"""

from __future__ import annotations

import threading
from collections.abc import Container
from typing import Any

from jobkeeper.events import EventKind, JobEvent

#: The ``outcome`` label of an attempt whose outcome the database refused.
CLAIM_LOST = "claim_lost"
#: The ``task`` label of jobs whose task the worker does not register.
UNREGISTERED_TASK = "(unregistered)"

#: Bucket bounds of the duration histogram, seconds: from a no-op job to a long report.
DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    float("inf"),
)  # fmt: skip


class WorkerMetrics:
    """An event listener counting this worker's jobs into its own registry.

    Args:
        registry: a ``prometheus_client.CollectorRegistry`` (default: a new one,
            so two workers in one process never share counters by accident).
        tasks: the task names the worker registers (``jq.tasks``; looked up
            at each event, so later registrations count): other names are
            labelled ``(unregistered)``. None: every name is its own label.

    Raises:
        ImportError: ``prometheus-client`` is not installed (the ``metrics`` extra).
    """

    def __init__(self, registry: Any = None, tasks: Container[str] | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self._tasks = tasks
        self.registry = registry if registry is not None else CollectorRegistry()
        self._processed = Counter(
            "jobkeeper_jobs_processed",
            "Attempts this worker ended, by outcome.",
            ["queue", "task", "outcome"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "jobkeeper_job_duration_seconds",
            "How long each attempt this worker ran took, in seconds.",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._rescues = Counter(
            "jobkeeper_rescues",
            "Jobs this worker's rescuer took back from silent holders.",
            registry=self.registry,
        )
        # Labelled children, found once: labels() validates and locks on
        # every call (about 2 us a job each, a tenth of a no-op job's cost).
        self._processed_of: dict[tuple[str, str, str], Any] = {}
        self._duration_of: dict[tuple[str, str], Any] = {}

    #: The events it counts (give them to ``JobQueue.on_event(metrics, kinds=...)``).
    kinds = frozenset(
        {EventKind.FINISHED, EventKind.ACKED, EventKind.CLAIM_LOST, EventKind.RESCUED}
    )

    def __call__(self, event: JobEvent) -> None:
        """Count one event (the listener given to ``JobQueue.on_event``)."""
        kind = event.kind
        if kind is EventKind.ACKED and event.outcome is not None:
            self._count(event, event.outcome.value)
        elif kind is EventKind.CLAIM_LOST:
            self._count(event, CLAIM_LOST)
        elif kind is EventKind.FINISHED and event.duration is not None:
            # How long the attempt ran, whatever became of its outcome.
            pair = (event.queue, self._task_label(event.task))
            duration = self._duration_of.get(pair)
            if duration is None:
                duration = self._duration_of[pair] = self._duration.labels(*pair)
            duration.observe(event.duration)
        elif kind is EventKind.RESCUED:
            self._rescues.inc()

    def _task_label(self, task: str) -> str:
        return task if self._tasks is None or task in self._tasks else UNREGISTERED_TASK

    def _count(self, event: JobEvent, outcome: str) -> None:
        key = (event.queue, self._task_label(event.task), outcome)
        processed = self._processed_of.get(key)
        if processed is None:
            processed = self._processed_of[key] = self._processed.labels(*key)
        processed.inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` (Prometheus text) on ``host:port`` from a daemon
        thread, each connection on a thread of its own, closed once its
        client sends nothing for ``IDLE_TIMEOUT`` seconds.

        Raises:
            OSError: the address cannot be bound.
        """
        from prometheus_client import make_wsgi_app

        from jobkeeper.metrics_server import bounded_server

        server = bounded_server(host, port, make_wsgi_app(self.registry))
        threading.Thread(target=server.serve_forever, name="jobkeeper-metrics", daemon=True).start()

    def render(self) -> str:
        """The metrics as Prometheus text (what ``/metrics`` serves)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()
