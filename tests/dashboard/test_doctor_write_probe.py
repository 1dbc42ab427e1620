"""``jobkeeper doctor`` tries a write (rolled back), and a database that takes
none is not blamed on the workers' hosts.

A break-test found doctor saying "ok" 12 times on databases that could not
write: PostgreSQL on a full disk (every enqueue failing while reads, claims
and heartbeats passed), and a SQLite file on a full disk or made immutable
(``chattr +i``), where it blamed the workers' hosts for their silence.
The full disk was checked by hand (a private server on a 48 MiB tmpfs filled
with ``dd``: the probe failed with "could not extend file ...: No space left
on device" where an enqueue still passed); here the database is read-only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from backends.helpers import register
from jobkeeper import JobQueue
from jobkeeper.backends.sqlite import backend as sqlite_backend
from jobkeeper.doctor import Check, run_checks
from support.db import PG_URL, pg_database_url, sql
from support.settings import FAST


def _checks(jq: JobQueue) -> dict[str, Check]:
    return {check.name: check for check in run_checks(jq)}


def _silent_worker(jq: JobQueue) -> None:
    """A registered worker whose last heartbeat is ten minutes old."""
    register(jq)
    if jq.backend.name == "sqlite":
        sql(jq, "UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - 600")
    else:
        sql(jq, "UPDATE jobkeeper_workers SET heartbeat_at = now() - interval '10 minutes'")


def _assert_writes_fail(checks: dict[str, Check], says: str) -> None:
    writes = checks["writes"]
    assert writes.level == "fail", writes
    assert says in writes.message, writes.message
    workers = checks["workers"]
    assert "silent past their rescue window" in workers.message, workers
    assert "check those hosts" not in workers.message, workers.message
    assert "takes no writes" in workers.message, workers.message


@pytest.fixture
def own_pg_db() -> Iterator[str]:
    """A database of this test's own on the shared server (dropped after)."""
    name = f"jk_probe_{secrets.token_hex(5)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.skipif(
    "postgres" not in os.environ.get("JOBKEEPER_TEST_BACKENDS", "postgres"),
    reason="PostgreSQL only",
)
def test_doctor_fails_the_write_probe_of_a_read_only_postgres_database(own_pg_db: str) -> None:
    url = pg_database_url(own_pg_db)
    with JobQueue(url, **FAST) as jq:
        jq.migrate()
        _silent_worker(jq)
        assert _checks(jq)["writes"].level == "ok"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{own_pg_db}" SET default_transaction_read_only = on')
    # jobkeeper's sessions ask for a read-write server (target_session_attrs),
    # so doctor already fails to connect; one that connects to any server
    # answers reads, and only the probe finds that writes fail.
    with JobQueue(url + "?target_session_attrs=any", **FAST) as jq:
        checks = _checks(jq)
    _assert_writes_fail(checks, "read-only transaction")
    assert checks["database"].level == "ok"


def test_doctor_fails_the_write_probe_of_a_sqlite_file_it_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    url = f"sqlite:///{path}"
    with JobQueue(url, **FAST) as jq:
        jq.migrate()
        _silent_worker(jq)
        assert _checks(jq)["writes"].level == "ok"
    # Root ignores the mode: make the file immutable as the break-test did.
    path.chmod(0o444)
    immutable = os.geteuid() == 0
    if immutable:
        chattr = shutil.which("chattr")
        done = chattr and subprocess.run([chattr, "+i", str(path)], check=False).returncode == 0
        if not done:
            pytest.skip("running as root without chattr +i: the file stays writable")
    try:
        with JobQueue(url, **FAST) as jq:
            checks = _checks(jq)
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o644)
    _assert_writes_fail(checks, "readonly")
    assert checks["database"].level == "ok"


def test_doctor_fails_the_write_probe_of_a_sqlite_file_on_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rolled-back write touches no disk on SQLite: the probe reads the
    # file system's free space (a real full disk was checked by hand).
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with JobQueue(url, **FAST) as jq:
        jq.migrate()
        _silent_worker(jq)
        full = types.SimpleNamespace(f_bavail=0, f_frsize=4096)
        monkeypatch.setattr(sqlite_backend.os, "statvfs", lambda _path: full)
        checks = _checks(jq)
    _assert_writes_fail(checks, "no space left on the device holding")
