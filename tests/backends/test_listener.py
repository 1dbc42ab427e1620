"""The PostgreSQL wake-up listener outlives a refused connection."""

from __future__ import annotations

import secrets
import threading
import time

import psycopg
import pytest

from jobkeeper import DatabaseUnavailable, JobQueue
from support.db import PG_URL, pg_database_url


def test_listener_survives_the_database_refusing_it_at_start(pg_url, caplog):
    # A worker that starts while the server refuses connections ("too many
    # clients") must keep its listener thread: naming the channel can fail
    # too, so it belongs inside the reconnect loop.
    jq = JobQueue(pg_url, heartbeat_interval=0.1, rescue_after=1.0, poll_interval=0.05)
    jq.migrate()
    backend = jq.backend
    real_channel = backend.channel
    refusals = {"left": 2}

    def refusing_channel() -> str:
        if refusals["left"]:
            refusals["left"] -= 1
            raise DatabaseUnavailable("PostgreSQL is unavailable: too many clients already")
        return real_channel()

    backend.channel = refusing_channel  # type: ignore[method-assign]
    heard: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=backend.listen, kwargs={"on_queue": heard.append, "stop": stop}, daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while "*" not in heard and time.monotonic() < deadline:
            time.sleep(0.02)
        assert refusals["left"] == 0
        assert "*" in heard, "the listener never got its LISTEN connection"
        jq.enqueue("anything", {})
        while "default" not in heard and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "default" in heard, "no wake-up for the enqueue after the refusals"
        assert thread.is_alive()
        assert "LISTEN connection lost" in caplog.text
    finally:
        stop.set()
        thread.join(5)
        jq.close()


def test_api_calls_fail_fast_while_the_database_refuses_connections():
    # An outage must not make every API call wait out the pool's 10 s
    # timeout while the pool retries in the background. A database that refuses new
    # connections and has lost its old ones is such an outage, for one
    # database only.
    name = f"jk_outage_{secrets.token_hex(4)}"
    admin = psycopg.connect(PG_URL, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = pg_database_url(name)
    jq = JobQueue(url)
    try:
        jq.migrate()
        jq.enqueue("anything", {})
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        time.sleep(1.2)  # past IDLE_CHECK_AFTER: the pooled connection gets checked
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="not currently accepting connections"):
                jq.enqueue("anything", {})
            assert time.monotonic() - started < 3.0
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        job = jq.enqueue("anything", {})
        assert jq.get_job(job.id) is not None
        assert jq.stats()["default"]["available"] == 2
    finally:
        jq.close()
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()
