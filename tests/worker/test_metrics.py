"""Per-worker Prometheus metrics (``jobkeeper worker --metrics-port``): what
this worker processed, counted from the event seam, on both backends.
"""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

from jobkeeper import Discard, JobStatus, Retry
from jobkeeper.metrics import WorkerMetrics
from support.settings import FAST
from support.waiting import wait_for, wait_status

from .helpers import gated_task, lose_claim_mid_run, running

ROOT = Path(__file__).resolve().parents[2]


def _sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        head, _, rest = metric.partition("{")
        found = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if head == name and found == wanted:
            return float(value)
    return 0.0


def test_the_counters_follow_what_the_worker_did(jq):
    metrics = WorkerMetrics()
    jq.on_event(metrics)

    @jq.task(max_attempts=2)
    def ok() -> int:
        return 1

    @jq.task(max_attempts=2)
    def flaky() -> None:
        raise Retry(delay=0)

    @jq.task
    def doomed() -> None:
        raise Discard("no")

    ids = [ok.enqueue().id, ok.enqueue().id, flaky.enqueue().id, doomed.enqueue().id]
    with running(jq.worker(concurrency=2)):
        wait_status(jq, ids, {JobStatus.COMPLETED, JobStatus.DEAD})
    text = metrics.render()
    processed = "jobkeeper_jobs_processed_total"
    assert _sample(text, processed, queue="default", task="ok", outcome="completed") == 2
    assert _sample(text, processed, queue="default", task="flaky", outcome="retried") == 1
    assert _sample(text, processed, queue="default", task="flaky", outcome="dead") == 1
    assert _sample(text, processed, queue="default", task="doomed", outcome="dead") == 1
    # Every attempt that ran was timed: 2 + 2 + 1.
    count = "jobkeeper_job_duration_seconds_count"
    assert _sample(text, count, queue="default", task="ok") == 2
    assert _sample(text, count, queue="default", task="flaky") == 2
    assert _sample(text, count, queue="default", task="doomed") == 1


def test_tasks_the_worker_does_not_register_share_one_label(jq):
    # Break-test: 200 unknown task names enqueued (external=True) made the
    # worker export 4,200 series, a label value per name a producer stored.
    metrics = WorkerMetrics(tasks=jq.tasks)
    jq.on_event(metrics)

    @jq.task
    def ok() -> None: ...

    ids = [ok.enqueue().id]
    ids += [jq.enqueue(f"junk_{i}", {}, external=True, max_attempts=1).id for i in range(5)]
    with running(jq.worker(concurrency=2)):
        wait_status(jq, ids, {JobStatus.COMPLETED, JobStatus.DEAD})
    text = metrics.render()
    processed = "jobkeeper_jobs_processed_total"
    assert _sample(text, processed, queue="default", task="ok", outcome="completed") == 1
    assert _sample(text, processed, queue="default", task="(unregistered)", outcome="dead") == 5
    assert "junk_" not in text


def test_rescues_are_counted(jq):
    metrics = WorkerMetrics()
    jq.on_event(metrics)
    (j,) = jq.enqueue_many([("lost", {})])
    (claimed,) = jq.backend.job_claim(worker_id="gone:1:aaaa", queue="default", limit=1)
    assert claimed.id == j.id
    with running(jq.worker(concurrency=1)):
        wait_for(lambda: jq.get_job(j.id).status != "lost", what="the rescue")
        wait_for(
            lambda: _sample(metrics.render(), "jobkeeper_rescues_total") >= 1,
            what="the rescue to be counted",
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_cli_worker_serves_its_metrics(db_url, tmp_path):
    from e2e.helpers import processes
    from jobkeeper import JobQueue

    with JobQueue(db_url) as jq:
        jq.migrate()
        ids = [jq.enqueue("sleep", {"seconds": 0.0}).id for _ in range(3)]
        port = _free_port()
        argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker"]
        argv += ["--app", "tests.e2e.apps:jq", "--metrics-port", str(port)]
        with processes(tmp_path) as procs:
            procs.spawn(argv, settings=FAST, name="worker")
            wait_status(jq, ids, {JobStatus.COMPLETED})

            def scrape() -> str | None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                        text = r.read().decode()
                except OSError:
                    return None
                done = _sample(
                    text,
                    "jobkeeper_jobs_processed_total",
                    queue="default",
                    task="sleep",
                    outcome="completed",
                )
                return text if done == 3 else None

            assert wait_for(scrape, what="the worker's /metrics to count 3 jobs")


def test_an_outcome_the_database_refused_is_not_counted_as_done(jq):
    # helper-77: a worker paused past rescue_after counted its refused
    # completion as completed, so the fleet reported 2 completions of 1 job.
    metrics = WorkerMetrics()
    jq.on_event(metrics)
    slow, gate = gated_task(jq)
    j = slow.enqueue()
    worker = jq.worker(concurrency=1)
    with running(worker):
        lose_claim_mid_run(jq, worker, j.id, gate)
        processed = "jobkeeper_jobs_processed_total"
        wait_for(
            lambda: (
                _sample(
                    metrics.render(), processed, queue="default", task="slow", outcome="claim_lost"
                )
                == 1
            ),
            what="the refused outcome to be counted",
        )
        worker.heartbeat.paused = False
        # Run again, and completed: one completion for one completed job.
        wait_status(jq, [j.id], {JobStatus.COMPLETED})
    text = metrics.render()
    assert _sample(text, processed, queue="default", task="slow", outcome="completed") == 1
    assert _sample(text, processed, queue="default", task="slow", outcome="claim_lost") == 1
    # Both attempts ran, and their time is kept.
    assert _sample(text, "jobkeeper_job_duration_seconds_count", queue="default", task="slow") == 2


def test_a_metrics_port_in_use_fails_in_one_line_before_any_job_runs(db_url):
    # A port in use is no bad input: exit 1, as the dashboard's --port, not 2.
    import subprocess

    from jobkeeper import JobQueue

    with JobQueue(db_url) as jq:
        jq.migrate()
        job = jq.enqueue("sleep", {"seconds": 0.0})
        with socket.create_server(("127.0.0.1", 0)) as taken:
            port = str(taken.getsockname()[1])
            argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker"]
            argv += ["--app", "tests.e2e.apps:jq", "--metrics-port", port]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert f"--metrics-port {port}" in last and "cannot listen there" in last
        assert "Traceback" not in done.stderr
        assert jq.get_job(job.id).status is JobStatus.AVAILABLE
