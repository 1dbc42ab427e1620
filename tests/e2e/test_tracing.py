"""Tracing across processes: the CLI worker (``jobkeeper worker --app``) runs
the app's traced queue, and its execution spans continue the traces of jobs
enqueued by another process, on both backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from support.settings import FAST
from support.waiting import DEADLINE

from .helpers import ROOT, env_for

pytestmark = pytest.mark.slow


def test_the_cli_worker_continues_the_enqueuers_trace(make_queue, db_url, tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    jq = make_queue(tracing=provider)
    good = jq.enqueue("ok", {"n": 1})
    bad = jq.enqueue("fails", {}, max_attempts=1)
    enqueues = {
        span.attributes["messaging.message.id"]: span  # type: ignore[index]
        for span in exporter.get_finished_spans()
    }

    trace_file = tmp_path / "spans.jsonl"
    env = {**env_for(FAST), "JK_TRACE_FILE": str(trace_file)}
    argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker"]
    argv += ["--app", "tests.e2e.tracing_app:jq", "--burst"]
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.path.exists(trace_file)
    spans = [json.loads(line) for line in trace_file.read_text().splitlines() if line]
    process = {s["attributes"]["messaging.message.id"]: s for s in spans}
    assert set(process) == {str(good.id), str(bad.id)}
    for job_id, span in process.items():
        parent = enqueues[job_id].context
        assert span["name"] == f"process {'ok' if job_id == str(good.id) else 'fails'}"
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["context"]["trace_id"] == f"0x{parent.trace_id:032x}"
        assert span["parent_id"] == f"0x{parent.span_id:016x}"
    assert process[str(good.id)]["status"]["status_code"] == "UNSET"
    failed = process[str(bad.id)]
    assert failed["attributes"]["jobkeeper.job.outcome"] == "dead"
    assert failed["status"]["status_code"] == "ERROR"
    (event,) = failed["events"]
    assert event["attributes"]["exception.type"] == "RuntimeError"
