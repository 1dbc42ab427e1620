"""Workers of different builds tell apart: each records its release with the
schema version its code expects (every build said "0.1.0", so a rolling
deploy's old and new workers looked alike in ``jobkeeper_workers``,
``status`` and the dashboard).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.sqlite.backend import MIGRATIONS
from jobkeeper.doctor import run_checks
from jobkeeper.models import WorkerInfo
from jobkeeper.queues import enforces_queue_settings, version_tuple
from jobkeeper.version import __version__, split_worker_version, worker_version
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for

from .helpers import processes

#: The newest schema version (both backends number migrations alike).
LATEST = MIGRATIONS[-1][0]


def register(jq: JobQueue, worker_id: str, version: str | None) -> None:
    now = datetime.now(UTC)
    info = WorkerInfo(worker_id, "h", 1, ["q"], now, now, version=version)
    jq.backend.worker_register(worker=info)
    if version is None:  # as a worker from before versions were recorded left it
        sql(jq, "UPDATE jobkeeper_workers SET version = NULL WHERE id = ?", [worker_id])


def test_a_worker_process_records_its_schema_version_and_status_shows_it(db_url, tmp_path):
    with JobQueue(db_url, **FAST) as jq:
        jq.migrate()
        with processes(tmp_path) as procs:
            worker = procs.worker(db_url, {})
            wait_for(lambda: jq.workers(), what="the worker's row")
            (info,) = jq.workers()
            assert info.pid == worker.pid
            assert info.version == f"{__version__} (schema {LATEST})"
            shown = subprocess.run(
                [sys.executable, "-m", "jobkeeper", "--database", db_url, "status", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert shown.returncode == 0, shown.stderr
            assert f'"version": "{__version__} (schema {LATEST})"' in shown.stdout
            assert f'"schema_version": {LATEST}' in shown.stdout
            table = subprocess.run(
                [sys.executable, "-m", "jobkeeper", "--database", db_url, "status"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "COLUMNS": "250"},
            )
            assert f"(schema {LATEST})" in table.stdout, table.stdout


def test_doctor_names_workers_of_an_older_schema(jq):
    register(jq, "new", worker_version(LATEST))
    register(jq, "built-before", __version__)  # a build that recorded no schema
    register(jq, "unversioned", None)
    workers = {c.name: c for c in run_checks(jq)}["workers"]
    assert workers.level == "ok", workers.message
    register(jq, "old", f"{__version__} (schema {LATEST - 1})")
    workers = {c.name: c for c in run_checks(jq)}["workers"]
    assert workers.level == "warn", workers.message
    assert f"old ({__version__} (schema {LATEST - 1}))" in workers.message
    assert f"database's {LATEST}" in workers.message
    assert "new" not in workers.message.replace("upgrade", "")


@pytest.mark.parametrize(
    ("recorded", "split", "release"),
    [
        ("0.1.0 (schema 17)", ("0.1.0", 17), (0, 1, 0)),
        # The schema's number is no part of the release.
        ("1.2 (schema 17)", ("1.2", 17), (1, 2)),
        ("0.1.0", ("0.1.0", None), (0, 1, 0)),
        ("0.2.0+local.3 (schema 20)", ("0.2.0+local.3", 20), (0, 2, 0)),
        (None, (None, None), None),
    ],
)
def test_readers_of_the_recorded_version(recorded, split, release):
    assert split_worker_version(recorded) == split
    assert version_tuple(recorded) == release
    assert enforces_queue_settings(recorded) is (recorded is not None)
