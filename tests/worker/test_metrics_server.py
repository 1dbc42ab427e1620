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


def _server_threads() -> set[threading.Thread]:
    """Threads serving a connection (socketserver names them for their target)."""
    return {t for t in threading.enumerate() if "process_request_thread" in t.name}


def _new_server_threads(before: set[threading.Thread]) -> int:
    """Serving threads started since ``before`` that are still alive: counted
    as a difference, one of an earlier test that ended meanwhile (a scrape's
    kept-alive connection closing at its idle timeout) hid one of this test's,
    or left the count below ``before`` for good.
    """
    return len(_server_threads() - before)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setattr(metrics_server, "IDLE_TIMEOUT", 4.0)
    port = _free_port()
    before = _server_threads()
    WorkerMetrics().serve(port)
    yield port, before


def test_silent_connections_are_closed_and_scrapes_are_served_beside_them(served):
    port, before = served
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
    try:
        # Served while the silent ones are still open and held (a cap of 16
        # turned every scrape away until they timed out).
        assert wait_for(
            lambda: _new_server_threads(before) >= 20, what="the silent connections to be held"
        )
        assert "jobkeeper_rescues_total" in _scrape(port)
        # Each is closed once its client has sent nothing for the idle
        # timeout (4 s here): prometheus_client's server kept them for ever.
        for sock in silent:
            sock.settimeout(5)
            assert sock.recv(1) == b""
    finally:
        for sock in silent:
            sock.close()
    assert wait_for(lambda: _new_server_threads(before) == 0, what="the server's threads to end")
    assert "jobkeeper_rescues_total" in _scrape(port)


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


def test_a_trickling_request_is_closed_at_the_deadline(served, monkeypatch):
    # One byte every 0.5 s, each within the idle timeout: the connection and
    # its thread lasted as long as the client kept trickling.
    monkeypatch.setattr(metrics_server, "REQUEST_DEADLINE", 2.0, raising=False)
    port, before = served
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
    closed: list[float] = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        for byte in request:
            if time.monotonic() - started > 8.0:
                break  # still open well past the deadline
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed.append(time.monotonic() - started)
                break
            sock.settimeout(0.5)
            try:
                if sock.recv(1) == b"":
                    closed.append(time.monotonic() - started)
                    break
            except TimeoutError:
                pass  # still open: the next byte
    # Closed at the deadline, not after the 2 minutes the whole trickle takes.
    assert closed and closed[0] < 2.0 + 4.0, closed
    assert wait_for(lambda: _new_server_threads(before) == 0, what="the server's threads to end")
    assert "jobkeeper_rescues_total" in _scrape(port)
