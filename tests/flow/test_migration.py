"""Migration 0007 on a database of an earlier version: jobs, dead letters and
worker rows are kept; workers registered before it show no version."""

from __future__ import annotations

import sys

import pytest

from jobkeeper import JobQueue
from support.db import sql


def test_0007_upgrades_a_database_in_use(db_url, monkeypatch):
    with JobQueue(db_url) as jq:
        module = sys.modules[type(jq.backend).__module__]
        with monkeypatch.context() as patch:
            patch.setattr(module, "MIGRATIONS", [m for m in module.MIGRATIONS if m[0] < 7])
            assert jq.migrate() < 7
            # Rows written by the code of that version (raw SQL: this code
            # writes the new columns).
            sql(
                db_url,
                "INSERT INTO jobkeeper_jobs (queue, task, args) VALUES ('q', 't', ?)",
                ['{"keep": 1}'],
            )
            job_id = int(sql(db_url, "SELECT max(id) FROM jobkeeper_jobs")[0][0])
            sql(
                db_url,
                "INSERT INTO jobkeeper_workers (id, hostname, pid, queues, started_at, "
                "heartbeat_at) VALUES ('old', 'h', 1, '[]', "
                + ("now(), now())" if db_url.startswith("postgres") else "0, 0)"),
            )
        assert jq.migrate() == module.MIGRATIONS[-1][0] >= 7
        assert jq.get_job(job_id).args == {"keep": 1}
        assert jq.get_job(job_id).serial_key is None
        assert [(w.id, w.version) for w in jq.workers()] == [("old", None)]
        with pytest.warns(UserWarning, match="old \\(no version\\)"):
            jq.configure_queue("q", concurrency=1)
        assert len(jq.backend.job_claim(worker_id="w", queue="q", limit=5)) == 1
