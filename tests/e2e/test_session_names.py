"""What jobkeeper's PostgreSQL sessions are called in ``pg_stat_activity``:
an operator counting a worker's connections, or ending one, must be able to
tell whose and what each is (a newcomer saw about ten per worker, all with
an empty ``application_name``). SQLite has no sessions to name.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from jobkeeper import JobQueue, JobStatus
from jobkeeper.backends.postgres.sources import session_name
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


def _name_of(url: str) -> str:
    jq = JobQueue(url, **FAST)
    try:
        return str(jq.backend._fetch_raw("SELECT current_setting('application_name')")[0][0])
    finally:
        jq.close()


@pytest.mark.parametrize("tail", ["?", "?connect_timeout=5&"])
def test_a_url_ending_in_a_separator_still_connects(tail):
    # libpq takes these; the name appended to them made "?&", which it refused.
    assert _name_of(f"{PG_URL.split('?')[0]}{tail}") == "jobkeeper"


def test_a_name_set_in_the_sessions_options_wins(monkeypatch):
    # "-c application_name=..." loses to the name the connection sends, so
    # none is sent then.
    base = PG_URL.split("?")[0]
    assert _name_of(f"{base}?options={quote('-c application_name=via-url')}") == "via-url"
    monkeypatch.setenv("PGOPTIONS", "-c application_name=via-env")
    assert _name_of(base) == "via-env"


def test_a_long_name_keeps_its_end_where_workers_differ():
    # A cloud host name pushed the pid and random part of the worker id past
    # the 63 bytes PostgreSQL keeps: two workers on one host looked the same.
    worker_id = "worker-deployment-7f9c8b6d5-abcde.prod-eu-west-1.internal.example:25433:6ee70ed1"
    name = session_name(f"side-effects {worker_id}")
    assert len(name.encode()) == 63
    assert name.startswith("jobkeeper side-effects worker-deployment")
    assert name.endswith(":25433:6ee70ed1") and "~" in name
    assert session_name("claims vm:6073:b17f1e66") == "jobkeeper claims vm:6073:b17f1e66"
    jq = JobQueue(PG_URL, **FAST)
    backend = jq.backend.dedicated(f"side-effects {worker_id}")
    try:
        assert backend._fetch_raw("SELECT current_setting('application_name')") == [(name,)]
    finally:
        backend.close()
        jq.close()
