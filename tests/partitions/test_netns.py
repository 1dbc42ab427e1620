"""The namespace helper itself: idempotent create and destroy, leftovers of a
killed run removed, and cuts that drop traffic one way or both, then heal.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
from benchmarks.soak import netns

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _namespaces_available() -> None:
    why_not = netns.available()
    assert why_not is None, f"network namespaces unavailable: {why_not}"


def _names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_create_and_destroy_are_idempotent():
    host = netns.Host(7)
    again = netns.Host(7)  # a leftover of the same name is replaced
    try:
        assert again.name == host.name and again.name in _names()
        assert again.subnet != "" and again.gateway != again.address
    finally:
        again.destroy()
        again.destroy()
        host.destroy()
    assert host.name not in _names()
    assert f"{host.veth_host}:" not in _links() and f"{host.veth_host}@" not in _links()


def test_leftovers_of_a_dead_run_are_removed_and_live_runs_kept():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    leftover = f"{netns.PREFIX}{int(dead.stdout)}n0"
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    subprocess.run(
        ["ip", "link", "add", f"{leftover}h", "type", "veth", "peer", "name", f"{leftover}p"],
        check=True,
    )
    with netns.Hosts(1) as hosts:  # removes leftovers first
        assert leftover not in _names()
        assert f"{leftover}h" not in _links()
        assert hosts[0].name in _names()
        assert netns.remove_leftovers() == []  # ours is alive: kept
        assert hosts[0].name in _names()


def _connects(host: netns.Host, port: int) -> bool:
    code = (
        "import socket, sys\n"
        f"s = socket.create_connection(({host.gateway!r}, {port}), timeout=1.5)\n"
        "s.sendall(b'x'); s.settimeout(1.5)\n"
        "sys.exit(0 if s.recv(1) == b'y' else 1)\n"
    )
    done = subprocess.run(host.wrap([sys.executable, "-c", code]), capture_output=True)
    return done.returncode == 0


@pytest.mark.parametrize("cut", netns.CUTS)
def test_a_cut_drops_traffic_until_healed(cut):
    with netns.Hosts(1) as hosts:
        host = hosts[0]
        server = socket.create_server((host.gateway, 0))
        port = server.getsockname()[1]
        stop = threading.Event()

        def serve() -> None:
            server.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(1)
                    try:
                        if conn.recv(1) == b"x":
                            conn.sendall(b"y")
                    except OSError:
                        pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            assert _connects(host, port)
            host.cut(cut)
            assert not _connects(host, port)
            host.heal()
            assert _connects(host, port)
        finally:
            stop.set()
            thread.join(5)
            server.close()
