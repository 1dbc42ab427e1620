"""/metrics: the queue-level gauges match the tables, on both backends."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from jobkeeper.dashboard import create_app
from jobkeeper.dashboard.app import PASSWORD_ENV
from jobkeeper.dashboard.metrics import render_metrics

from .seed import seed


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
    expected = {
        (queue, status): count
        for queue, per_status in jq.stats().items()
        for status, count in per_status.items()
        if count
    }
    assert jobs == expected
    assert samples[("jobkeeper_workers", ())] == 1
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
def test_finished_counts_above_the_cap_are_estimates(jq, exact_below):
    # Thirteen finished jobs against a cap of 3 or 5: the count reads at most
    # cap + 1 rows and says it is an estimate; live statuses stay exact.
    seed(jq)
    if jq.backend.name == "postgresql":
        jq.backend._fetch_raw("ANALYZE jobkeeper_jobs")
    counts = jq.queue_counts(exact_below=exact_below)
    assert counts.estimated == {"completed", "cancelled"}
    finished = counts.counts["default"]["completed"] + counts.counts["emails"]["cancelled"]
    assert exact_below < finished <= 60
    assert counts.counts["default"]["retryable"] == 1
    assert counts.counts["emails"]["available"] == 3
    body, _ = render_metrics(jq, exact_below=exact_below)
    samples = _samples(body.decode())
    assert samples[("jobkeeper_jobs_estimated", (("status", "completed"),))] == 1
    exact = jq.queue_counts()
    assert exact.estimated == frozenset() and exact.counts["default"]["completed"] == 12


def test_metrics_on_an_empty_database(jq):
    body, _ = render_metrics(jq)
    samples = _samples(body.decode())
    assert samples[("jobkeeper_workers", ())] == 0
    assert not [key for key in samples if key[0] == "jobkeeper_jobs"]


def test_estimates_scale_to_the_whole(jq):
    # 300 completed jobs finished evenly over the last 300 s, counted with a
    # cap of 100: the estimate comes near 300 on both backends.
    jobs = jq.enqueue_many([("t", {"i": i}) for i in range(300)])
    claimed = jq.backend.job_claim(worker_id="w", queue="default", limit=300)
    from jobkeeper.models import Completion
    from jobkeeper.outcomes import claim_of

    jq.backend.job_complete_many(
        completions=[Completion(claim_of(j), None) for j in claimed], delete=False
    )
    first = jobs[0].id
    if jq.backend.name == "postgresql":
        jq.backend._fetch_raw(
            "UPDATE jobkeeper_jobs"
            " SET finished_at = now() - make_interval(secs => 300 - (id - %s))",
            (first,),
        )
        jq.backend._fetch_raw("ANALYZE jobkeeper_jobs")
    else:
        jq.backend._conn().execute(
            "UPDATE jobkeeper_jobs SET finished_at = finished_at - 300 + (id - ?)", (first,)
        )
    counts = jq.queue_counts(exact_below=100)
    assert counts.estimated == {"completed", "cancelled"}
    assert 240 <= counts.counts["default"]["completed"] <= 360
    assert jq.queue_counts(exact_below=1000).counts["default"]["completed"] == 300
