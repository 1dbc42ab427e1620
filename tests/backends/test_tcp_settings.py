"""TCP keepalives and ``tcp_user_timeout`` on every PostgreSQL connection of
ours (``sources.TCP_DEFAULTS``), read back from the sockets themselves.

A break-test dropped a worker's packets (a network namespace with blackhole
routes): every thread waited 15 min 39 s, the kernel's retransmissions, with
nothing logged; idle connections would have waited for the system's two
hours of keepalive. With these a dead peer is found in about half a minute.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from jobkeeper import JobQueue

# Linux's number where the socket module lacks the name.
TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def tcp_settings(fd: int) -> dict[str, int]:
    sock = socket.socket(fileno=os.dup(fd))
    try:
        return {
            "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT),
        }
    finally:
        sock.close()


DEFAULTS = {"keepalive": 1, "idle": 15, "interval": 5, "count": 3, "user_timeout_ms": 20000}


def test_pooled_dedicated_and_async_connections_carry_the_tcp_defaults(pg_url: str) -> None:
    assert "127.0.0.1" in pg_url or "localhost" in pg_url  # TCP, not a Unix socket
    jq = JobQueue(pg_url)
    jq.migrate()
    dedicated = jq.backend.dedicated("tcp test")
    try:
        with jq.backend._cursor() as cursor:
            assert tcp_settings(cursor.connection.pgconn.socket) == DEFAULTS
        with dedicated._source.connection() as conn:
            assert tcp_settings(conn.pgconn.socket) == DEFAULTS

        async def async_settings() -> dict[str, int]:
            pool = (await jq.backend._async_pool()).pool
            conn: Any = await pool.getconn()
            try:
                return tcp_settings(conn.pgconn.socket)
            finally:
                await pool.putconn(conn)
                await jq.aclose()

        assert asyncio.run(async_settings()) == DEFAULTS
    finally:
        dedicated.close()
        jq.close()


def test_the_urls_own_tcp_settings_win(pg_url: str) -> None:
    jq = JobQueue(f"{pg_url}&keepalives_idle=42&tcp_user_timeout=0")
    try:
        jq.migrate()
        with jq.backend._cursor() as cursor:
            got = tcp_settings(cursor.connection.pgconn.socket)
        assert got == {**DEFAULTS, "idle": 42, "user_timeout_ms": 0}
    finally:
        jq.close()
