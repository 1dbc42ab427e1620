"""Queue-level Prometheus metrics for the dashboard's ``/metrics``.

A custom collector reads the database at scrape time through the API, so
the numbers are the database's, whichever process serves them:

- ``jobkeeper_jobs{queue,status}``: jobs per queue and status (dead letters
  as ``dead``), every status of every queue that has jobs (0 included). Live
  statuses are exact; ``completed`` and ``cancelled`` are
  exact while together below 100,000 rows, ``dead`` while the dead letters
  are; above, they come from a recount the serving process makes at most
  once a minute, plus the rows finished since
  (:meth:`jobkeeper.JobQueue.queue_counts`).
  ``jobkeeper_jobs_estimated{status}`` is 1 for the statuses so counted in
  this scrape; ``jobkeeper_jobs_lower_bound{status}`` is 1 for those that
  had no recount to go by (it failed: see the log) and show only what the
  newest rows hold.
- ``jobkeeper_queue_latency_seconds{queue}``: age of the oldest job that
  could run now (0 for a queue with nothing due).
- ``jobkeeper_workers{state}``: registered worker processes, ``live`` or
  ``stale`` (silent past their rescue window, as the rescuers judge it).

Per-worker counters (processed, durations, rescues) live on the worker's
own ``--metrics-port``, not here.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from jobkeeper.api import JobQueue
from jobkeeper.config import is_stale
from jobkeeper.models import JobStatus

#: Rows of a finished status counted at each scrape; above, a recount.
EXACT_BELOW = 100_000


#: The statuses ``jobkeeper_jobs`` reports for each queue (dead: its dead letters).
JOB_STATUSES = tuple(status.value for status in JobStatus)


class QueueCollector(Collector):
    """Collects the queue-level gauges of one :class:`JobQueue` per scrape."""

    def __init__(self, jq: JobQueue, *, exact_below: int = EXACT_BELOW) -> None:
        self.jq = jq
        self.exact_below = exact_below

    def collect(self) -> Iterator[Metric]:
        counts = self.jq.queue_counts(exact_below=self.exact_below)
        oldest = self.jq.oldest_due()
        workers = self.jq.workers()
        jobs = GaugeMetricFamily(
            "jobkeeper_jobs",
            f"Jobs per queue and status (finished statuses from a recount above "
            f"{self.exact_below} rows; see jobkeeper_jobs_estimated).",
            labels=["queue", "status"],
        )
        # Every status of every queue, 0 included: a series that vanished when
        # its last job left would read as "no data", not as none.
        for queue, per_status in sorted(counts.counts.items()):
            for status in JOB_STATUSES:
                jobs.add_metric([queue, status], per_status.get(status, 0))
        yield jobs
        estimated = GaugeMetricFamily(
            "jobkeeper_jobs_estimated",
            "1 when this scrape's jobkeeper_jobs counts of the status come from a recount.",
            labels=["status"],
        )
        for status in ("completed", "cancelled", "dead"):
            estimated.add_metric([status], 1 if status in counts.estimated else 0)
        yield estimated
        lower_bound = GaugeMetricFamily(
            "jobkeeper_jobs_lower_bound",
            "1 when this scrape's jobkeeper_jobs counts of the status are a lower bound: "
            "no recount to go by (it failed; see the serving process's log).",
            labels=["status"],
        )
        for status in ("completed", "cancelled", "dead"):
            lower_bound.add_metric([status], 1 if status in counts.lower_bound else 0)
        yield lower_bound
        latency = GaugeMetricFamily(
            "jobkeeper_queue_latency_seconds",
            "Age of the oldest job of the queue that could run now (0: none due).",
            labels=["queue"],
        )
        for queue in sorted(set(counts.counts) | set(oldest)):
            latency.add_metric([queue], oldest[queue][1] if queue in oldest else 0.0)
        yield latency
        now = self.jq.backend.db_now() if workers else None
        stale = sum(
            1
            for worker in workers
            if now is not None and is_stale(worker, now, self.jq.settings.rescue_after)
        )
        registered = GaugeMetricFamily(
            "jobkeeper_workers",
            "Registered worker processes; stale: silent past their rescue window (most "
            "likely dead, their rows kept until pruned; their running jobs due for rescue).",
            labels=["state"],
        )
        registered.add_metric(["live"], len(workers) - stale)
        registered.add_metric(["stale"], stale)
        yield registered


def render_metrics(jq: JobQueue, *, exact_below: int = EXACT_BELOW) -> tuple[bytes, str]:
    """The Prometheus text exposition for ``jq`` and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(jq, exact_below=exact_below))
    return generate_latest(registry), CONTENT_TYPE_LATEST
