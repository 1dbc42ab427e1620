"""What jobkeeper's PostgreSQL sessions are called in ``pg_stat_activity``:
an operator counting a worker's connections, or ending one, must be able to
tell whose and what each is (a newcomer saw about ten per worker, all with
an empty ``application_name``). SQLite has no sessions to name.
"""

from __future__ import annotations

import pytest

from jobkeeper import JobQueue, JobStatus
from support.db import PG_URL, sql
from support.settings import FAST
from support.waiting import wait_for, wait_status

from .helpers import processes, wait_exit

pytestmark = pytest.mark.slow

#: Sessions every PostgreSQL worker opens once it runs a job (the pruner's,
#: the periodic enqueuer's and the start checks' open only when needed).
ROLES = {"claims", "outcomes", "heartbeat", "leader", "rescuer", "listener"}


def session_names(like: str) -> list[str]:
    rows = sql(
        PG_URL,
        "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
        (like,),
    )
    return sorted(str(row[0]) for row in rows)


def test_a_workers_sessions_name_their_role_and_the_worker(pg_url, tmp_path):
    jq = JobQueue(pg_url, **FAST)
    jq.migrate()
    try:
        with processes(tmp_path) as procs:
            worker = procs.worker(pg_url, {})
            worker_id = wait_for(
                lambda: sql(
                    pg_url, "SELECT id FROM jobkeeper_workers WHERE pid = %s", (worker.pid,)
                ),
                what="the worker's row",
            )[0][0]
            # The outcomes connection opens as the worker starts, not with
            # its first outcome (which it would delay).
            wait_for(
                lambda: session_names(f"jobkeeper outcomes {worker_id}"),
                what="the outcomes session before any job",
            )
            job = jq.enqueue("sleep", {"seconds": 0})
            wait_status(jq, [job.id], {JobStatus.COMPLETED})

            def roles() -> set[str]:
                names = session_names(f"% {worker_id}")
                assert all(name.startswith("jobkeeper ") for name in names), names
                return {name.split(" ")[1] for name in names}

            wait_for(lambda: roles() >= ROLES, what=f"sessions of {sorted(ROLES)}, saw {roles()}")
            worker.terminate()
            assert wait_exit(worker) == 0, procs.log(worker)
        wait_for(lambda: not session_names(f"% {worker_id}"), what="the worker's sessions closed")
    finally:
        jq.close()


def test_the_api_pools_sessions_are_named_jobkeeper(pg_url):
    jq = JobQueue(pg_url, **FAST)
    try:
        assert jq.backend._fetch_raw("SELECT current_setting('application_name')") == [
            ("jobkeeper",)
        ]
    finally:
        jq.close()


def test_a_name_in_the_url_or_pgappname_wins(pg_url, monkeypatch):
    named = JobQueue(f"{pg_url}&application_name=billing-web", **FAST)
    try:
        rows = named.backend._fetch_raw("SELECT current_setting('application_name')")
        assert rows == [("billing-web",)]
        worker_backend = named.backend.dedicated("claims w1")
        try:
            rows = worker_backend._fetch_raw("SELECT current_setting('application_name')")
            assert rows == [("billing-web",)]
        finally:
            worker_backend.close()
    finally:
        named.close()
    monkeypatch.setenv("PGAPPNAME", "billing-cron")
    from_env = JobQueue(pg_url, **FAST)
    try:
        rows = from_env.backend._fetch_raw("SELECT current_setting('application_name')")
        assert rows == [("billing-cron",)]
    finally:
        from_env.close()
