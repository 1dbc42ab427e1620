"""Fixtures of the dashboard's tests: a seeded queue and a client of its app."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from jobkeeper.dashboard import create_app
from jobkeeper.dashboard.app import PASSWORD_ENV

from .seed import seed

# The frozen-server test runs benchmarks.soak's private PostgreSQL (a
# package at the repository root, which pytest does not put on sys.path).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def served(monkeypatch) -> list[dict[str, Any]]:
    """Replaces uvicorn's Server.run: records what would be served instead of serving."""
    import uvicorn

    calls: list[dict[str, Any]] = []

    def run(server: uvicorn.Server, sockets: Any = None) -> None:
        config = server.config
        calls.append({"app": config.app, "host": config.host, "port": config.port})

    monkeypatch.setattr(uvicorn.Server, "run", run)
    return calls


@pytest.fixture
def seeded(jq):
    return seed(jq)


@pytest.fixture
def client(jq, seeded, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with TestClient(create_app(jq)) as client:
        yield client


def _token(client: TestClient, page: str = "/dead") -> str:
    html = client.get(page).text
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)
