"""PostgreSQL API calls on pooled connections survive the server ending its
sessions (a restart, a failover, ``pg_terminate_backend``).
"""

from __future__ import annotations

import secrets
import time

import psycopg

from jobkeeper import JobQueue
from support.db import PG_URL


def _end_sessions(application_name: str) -> None:
    """Terminate every session of ``application_name`` (what a server restart
    does to a client's connections) and wait until they are gone.
    """
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        pids = [
            row[0]
            for row in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                (application_name,),
            ).fetchall()
        ]
        assert pids, f"no session of {application_name} to end"
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if left is not None and left[0] == 0:
                return
            time.sleep(0.01)
    raise AssertionError(f"sessions {pids} still there after 10 s")


def test_api_calls_right_after_the_server_ends_the_pooled_sessions(pg_url):
    # The pool pinged a connection on checkout only after it sat idle for a
    # second, so the first call within that second after a restart failed
    # with "terminating connection due to administrator command". The
    # server says so on the socket before closing it: a checkout that finds
    # the socket readable pings, and the pool replaces the dead connection.
    name = f"jk_pool_{secrets.token_hex(4)}"
    jq = JobQueue(f"{pg_url}&application_name={name}")
    jq.migrate()
    try:
        for round_ in range(5):
            job = jq.enqueue("anything", {"round": round_})
            _end_sessions(name)
            # Well within the idle-ping window: nothing but the socket tells.
            again = jq.enqueue("anything", {"round": round_, "again": True})
            assert jq.get_job(job.id) is not None
            _end_sessions(name)
            fetched = jq.get_job(again.id)
            assert fetched is not None and fetched.args == {"round": round_, "again": True}
        assert len(jq.list_jobs(limit=100)) == 10
    finally:
        jq.close()
