"""/metrics: the queue-level gauges match the tables, on both backends."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from jobkeeper.backends import cockpit
from jobkeeper.dashboard import create_app
from jobkeeper.dashboard.app import PASSWORD_ENV
from jobkeeper.dashboard.metrics import render_metrics
from jobkeeper.models import JobStatus
from worker.helpers import age_heartbeat

from .seed import seed


def _nonzero(stats: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {queue: {s: n for s, n in per.items() if n} for queue, per in stats.items()}
    return {queue: per for queue, per in out.items() if per}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_match_the_tables(jq, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    seeded = seed(jq)
    response = TestClient(create_app(jq)).get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    jobs = {
        (dict(labels)["queue"], dict(labels)["status"]): value
        for (name, labels), value in samples.items()
        if name == "jobkeeper_jobs"
    }
    # Every status of every queue with jobs, zeros too: a series whose last
    # job left reads 0, not "no data" (helper-77).
    expected = {
        (queue, status.value): per_status.get(status.value, 0)
        for queue, per_status in jq.stats().items()
        for status in JobStatus
    }
    assert jobs == expected
    assert jobs[("reports", "running")] == 0
    assert samples[("jobkeeper_workers", (("state", "live"),))] == 1
    assert samples[("jobkeeper_workers", (("state", "stale"),))] == 0
    # A worker silent past its window (SIGKILLed) is stale until pruned.
    age_heartbeat(jq, seeded.worker_id, 3600)
    samples = _samples(TestClient(create_app(jq)).get("/metrics").text)
    assert samples[("jobkeeper_workers", (("state", "live"),))] == 0
    assert samples[("jobkeeper_workers", (("state", "stale"),))] == 1
    latency = {
        dict(labels)["queue"]: value
        for (name, labels), value in samples.items()
        if name == "jobkeeper_queue_latency_seconds"
    }
    oldest_job = jq.get_job(seeded.available[0])
    age = (jq.backend.db_now() - oldest_job.scheduled_at).total_seconds()
    assert 0 <= latency["emails"] <= age + 0.01
    assert latency["reports"] == 0  # only a job scheduled in the future
    assert samples[("jobkeeper_jobs_estimated", (("status", "completed"),))] == 0


@pytest.mark.parametrize("exact_below", [3, 5])
def test_finished_counts_above_the_cap_come_from_a_recount(jq, exact_below, monkeypatch):
    # Thirteen finished jobs against a cap of 3 or 5: counted all the same,
    # and named as counted by a recount; live statuses stay exact. (Without
    # the recount's margin: all thirteen finished within it, and more than
    # the cap finished within it are read only up to the cap.)
    monkeypatch.setattr(cockpit, "RECOUNT_MARGIN", 0.0)
    seed(jq)
    counts = jq.queue_counts(exact_below=exact_below)
    assert counts.estimated == {"completed", "cancelled"}
    assert counts.counts == _nonzero(jq.stats())
    body, _ = render_metrics(jq, exact_below=exact_below)
    samples = _samples(body.decode())
    assert samples[("jobkeeper_jobs_estimated", (("status", "completed"),))] == 1
    assert samples[("jobkeeper_jobs", (("queue", "default"), ("status", "completed")))] == 12
    exact = jq.queue_counts()
    assert exact.estimated == frozenset() and exact.counts["default"]["completed"] == 12


def test_metrics_on_an_empty_database(jq):
    body, _ = render_metrics(jq)
    samples = _samples(body.decode())
    assert samples[("jobkeeper_workers", (("state", "live"),))] == 0
    assert not [key for key in samples if key[0] == "jobkeeper_jobs"]
