"""A LISTEN connection on a queue's NOTIFY channel, and the PostgreSQL-only
fixtures the wake-up tests share: ``pg_jq`` (a migrated queue in a fresh
schema) and ``listener`` (listening on its channel). Import the fixtures
into a test module to use them.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql as pgsql

from backends.helpers import current_schema
from jobkeeper import JobQueue
from jobkeeper.config import NAME_MAX_LENGTH

#: Longest notification jobkeeper sends: a queue name, a space and seconds.
PAYLOAD_BOUND = NAME_MAX_LENGTH + 1 + 32


class Listener:
    """A LISTEN connection on the queue's channel, collecting payloads on a thread."""

    def __init__(self, jq: JobQueue) -> None:
        self.channel = f"jobkeeper_{current_schema(jq)}"
        self.payloads: list[str] = []
        self.conn = psycopg.connect(jq.url.url, autocommit=True)
        self.conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.channel)))

    def drain(self, *, until: int, timeout: float = 20.0) -> list[str]:
        """Collect notifications until ``until`` have arrived in total (or the deadline)."""
        missing = until - len(self.payloads)
        if missing > 0:
            for notify in self.conn.notifies(timeout=timeout, stop_after=missing):
                assert notify.channel == self.channel
                self.payloads.append(notify.payload)
        assert all(len(p.encode()) <= PAYLOAD_BOUND for p in self.payloads), self.payloads
        return self.payloads

    def wait_for(self, payload: str, timeout: float = 20.0) -> bool:
        """Collect notifications until ``payload`` arrives (or the deadline)."""
        deadline = time.monotonic() + timeout
        while payload not in self.payloads and time.monotonic() < deadline:
            for notify in self.conn.notifies(timeout=0.5, stop_after=1):
                self.payloads.append(notify.payload)
        return payload in self.payloads

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def pg_jq(pg_url):
    with JobQueue(pg_url) as jq:
        jq.migrate()
        yield jq


@pytest.fixture
def listener(pg_jq):
    heard = Listener(pg_jq)
    yield heard
    heard.close()
