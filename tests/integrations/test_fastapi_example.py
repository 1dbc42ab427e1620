"""examples/fastapi_app with FastAPI's TestClient on both backends: a
request's enqueue commits or rolls back with its SQLAlchemy session, and the
job runs (jobkeeper.testing.drain) and is shown by the app."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from jobkeeper.testing import assert_enqueued, drain, refute_enqueued

APP = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app" / "app.py"


@pytest.fixture
def example(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example app module, imported afresh on ``db_url``."""
    monkeypatch.setenv("EXAMPLE_DATABASE_URL", db_url)
    name = "jobkeeper_example_fastapi_app"
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
        module.engine.dispose()


def test_signup_enqueues_in_the_request_transaction(example: ModuleType) -> None:
    with TestClient(example.app) as client:
        placed = client.post("/signups", json={"email": "a@example.com"})
        assert placed.status_code == 200, placed.text
        ids = placed.json()
        assert_enqueued(example.send_welcome, {"signup_id": ids["signup"]}, count=1)

        failed = client.post(
            "/signups", json={"email": "b@example.com", "fail_after_enqueue": True}
        )
        assert failed.status_code == 409
        # Rolled back together: only the first signup's job exists.
        assert_enqueued(example.send_welcome, count=1)
        assert client.get(f"/signups/{ids['signup'] + 1}").status_code == 404

        assert client.get(f"/jobs/{ids['job']}").json()["status"] == "available"
        assert drain(example.jq) == {"completed": 1}
        refute_enqueued(example.send_welcome)
        assert client.get(f"/jobs/{ids['job']}").json() == {
            "status": "completed",
            "result": "welcomed a@example.com",
            "attempt": 1,
        }
        assert client.get(f"/signups/{ids['signup']}").json() == {
            "email": "a@example.com",
            "welcomed": True,
        }


def test_the_dashboard_mounted_as_the_docs_say_serves_every_page(example: ModuleType) -> None:
    # Found by a break-test: docs/fastapi.md mounted it at /jobs, where the
    # example's own GET /jobs/{job_id} answered /jobs/queues with a 422.
    import jobkeeper.dashboard

    example.app.mount("/admin/jobs", jobkeeper.dashboard.create_app(example.jq, read_only=True))
    with TestClient(example.app) as client:  # its lifespan migrates
        job = example.jq.enqueue("send_welcome", {"signup_id": 1})
        for page in ("/", "/queues", "/dead", "/workers", "/periodic", "/jobs", f"/jobs/{job.id}"):
            answer = client.get("/admin/jobs" + page)
            assert answer.status_code == 200, (page, answer.text[:200])
        assert client.get(f"/jobs/{job.id}").json()["status"] == "available"
