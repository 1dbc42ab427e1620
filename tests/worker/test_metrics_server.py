"""The worker's metrics port under clients that connect and say nothing:
prometheus_client's own server kept a thread per such connection for as long
as it stayed open. No database: the server is what is tested.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from jobkeeper import metrics_server
from jobkeeper.metrics import WorkerMetrics
from support.waiting import wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_threads() -> int:
    """Threads serving a connection (socketserver names them for their target)."""
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setattr(metrics_server, "IDLE_TIMEOUT", 1.0)
    monkeypatch.setattr(metrics_server, "MAX_CONNECTIONS", 4)
    port = _free_port()
    before = _server_threads()
    WorkerMetrics().serve(port)
    yield port, before


def test_silent_connections_are_bounded_and_closed_and_scrapes_go_on(served):
    port, before = served
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
    try:
        time.sleep(0.3)
        # Four threads at most wait on silent clients; the others were closed
        # unanswered (prometheus_client's server had one thread per socket).
        assert _server_threads() - before <= 4
        # Once the silent ones time out (1 s here), a scrape is served.
        assert wait_for(
            lambda: "jobkeeper_rescues_total" in _try(port), what="a scrape past silent clients"
        )
        for sock in silent:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # the server closed it
    finally:
        for sock in silent:
            sock.close()
    assert wait_for(lambda: _server_threads() - before == 0, what="the server's threads to end")


def _try(port: int) -> str:
    try:
        return _scrape(port)
    except OSError:
        return ""


def test_a_scrape_is_served_with_content_negotiation(served):
    port, _ = served
    assert "# TYPE jobkeeper_rescues_total counter" in _scrape(port)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
        assert reply.read().decode().rstrip().endswith("# EOF")
