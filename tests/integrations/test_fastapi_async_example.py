"""examples/fastapi_async with FastAPI's TestClient on PostgreSQL: a request's
async enqueue commits or rolls back with its AsyncSession, and another request
waits for the job's result (wait_async) while a real worker runs it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from jobkeeper.testing import assert_enqueued
from worker.helpers import running

APP = Path(__file__).resolve().parents[2] / "examples" / "fastapi_async" / "app.py"


@pytest.fixture
def example(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example app module, imported afresh on a fresh schema."""
    monkeypatch.setenv("EXAMPLE_DATABASE_URL", pg_url)
    name = "jobkeeper_example_fastapi_async"
    spec = importlib.util.spec_from_file_location(name, APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        module.jq.close()


def test_async_enqueue_joins_the_request_and_the_result_is_awaited(example: ModuleType) -> None:
    with TestClient(example.app) as client:
        placed = client.post("/reports", json={"customer": "acme"})
        assert placed.status_code == 200, placed.text
        ids = placed.json()
        failed = client.post("/reports", json={"customer": "gone", "fail_after_enqueue": True})
        assert failed.status_code == 409
        assert_enqueued(example.build_report, count=1, jq=example.jq)

        # No worker yet: the wait ends at its timeout, and the loop was free.
        assert client.get(f"/reports/{ids['job']}?timeout=0.2").status_code == 202
        # An id that is no job (or one pruned since): a 404, not a 500.
        assert client.get("/reports/999999999?timeout=0.2").status_code == 404
        # Values wait_async refuses are the client's error, not a 500 (break-test).
        for bad in ("/reports/0", f"/reports/{ids['job']}?timeout=-1",
                    f"/reports/{ids['job']}?timeout=nan"):  # fmt: skip
            assert client.get(bad).status_code == 422, bad
        with running(example.jq.worker(queues=["reports"])):
            answer = client.get(f"/reports/{ids['job']}?timeout=60")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "report": {"request": ids["request"], "customer": "acme", "lines": 4}
        }
