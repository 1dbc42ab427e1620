"""The traced JobQueue app of the tracing e2e test:

    python -m jobkeeper --database URL worker --app tests.e2e.tracing_app:jq

Each finished span is written as one JSON line to ``$JK_TRACE_FILE`` (the
SDK's console exporter, exported synchronously as each span ends), so the
test reads what the worker process traced after it exited.
"""

from __future__ import annotations

import json
import os
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from jobkeeper import JobQueue

SETTINGS: dict[str, Any] = json.loads(os.environ.get("JK_E2E_SETTINGS", "{}"))


def _line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


provider = TracerProvider()
provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(out=open(os.environ["JK_TRACE_FILE"], "a"), formatter=_line)  # noqa: SIM115 - open for the process's life
    )
)
jq = JobQueue("sqlite:///unused-e2e.db", tracing=provider, **SETTINGS)


@jq.task
def ok(n: int) -> int:
    return n


@jq.task(max_attempts=1)
def fails() -> None:
    raise RuntimeError("out of paper")
