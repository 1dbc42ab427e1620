"""A worker started with a URL the database refuses for good stops at once;
one started before its database waits for it.

What waiting does not fix -- a database, role or password the server
refuses, a search path naming no schema, a SQLite directory that does not
exist -- ends ``jobkeeper worker`` with one line naming it and exit 1, and
``migrate``, ``doctor`` and ``enqueue`` say the same of the same URL. A port
nobody listens on (the database not up yet) is still waited out.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from jobkeeper import DatabaseError, DatabaseRefused, DatabaseUnavailable, JobQueue
from support.db import PG_URL, pg_database_url
from support.settings import FAST

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.e2e.apps:jq"
#: Seconds a refused worker may take to exit (one connect, the interpreter's start).
EXIT_WITHIN = 15.0


def _with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _missing_database() -> str:
    return pg_database_url(f"jk_missing_{secrets.token_hex(4)}")


def _missing_role() -> str:
    return _with_user(PG_URL, f"jk_no_role_{secrets.token_hex(4)}")


def _missing_schema() -> str:
    options = quote(f"-c search_path=jk_no_schema_{secrets.token_hex(4)}", safe="")
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}options={options}"


def _jobkeeper(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _worker(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobkeeper", "--database", url, "worker", "--app", APP],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JK_E2E_SETTINGS": '{"poll_interval": 0.1}'},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _error_line(stderr: str) -> str:
    """The CLI's one error line: the last line, ``error: ...``, with no traceback."""
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), stderr
    return last


REFUSED = [
    pytest.param(_missing_database, 'database "jk_missing_', id="missing-database"),
    pytest.param(_missing_role, 'role "jk_no_role_', id="missing-role"),
    pytest.param(_missing_schema, "no schema of the search_path exists", id="missing-schema"),
]


@pytest.mark.parametrize(("make_url", "names"), REFUSED)
def test_a_worker_on_a_url_refused_for_good_exits_at_once_with_the_reason(make_url, names):
    url = make_url()
    started = time.monotonic()
    with _worker(url) as proc:
        try:
            _, stderr = proc.communicate(timeout=EXIT_WITHIN)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 1, stderr
    assert time.monotonic() - started < EXIT_WITHIN
    line = _error_line(stderr)
    assert names in line, stderr
    assert "database unavailable at start" not in stderr
    assert "stopped before it started" in stderr


@pytest.mark.parametrize(("make_url", "names"), REFUSED)
def test_migrate_doctor_and_enqueue_say_what_the_worker_says(make_url, names):
    url = make_url()
    worker = _jobkeeper("--database", url, "worker", "--app", APP, timeout=EXIT_WITHIN)
    said = _error_line(worker.stderr).removeprefix("error: ")
    for command in (["migrate"], ["enqueue", "t"], ["status"]):
        result = _jobkeeper("--database", url, *command)
        assert result.returncode == 1, (command, result.stderr)
        assert _error_line(result.stderr) == f"error: {said}", command
    doctor = _jobkeeper("--database", url, "doctor")
    assert doctor.returncode == 1
    assert said in doctor.stdout and "cannot use" in doctor.stdout, doctor.stdout
    assert names in said


def test_run_worker_raises_database_refused_without_waiting():
    jq = JobQueue(_missing_database(), **FAST)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseRefused, match="does not exist -- create it"):
            jq.run_worker()  # not burst: an outage would be waited out
        assert time.monotonic() - started < 10
        # A producer meets the same error; code that catches outages still
        # catches it (and a running worker retries through it).
        with pytest.raises(DatabaseUnavailable, match="refused the connection"):
            jq.enqueue("t", {})
    finally:
        jq.close()


def test_a_worker_before_its_database_is_up_keeps_waiting():
    # Nobody listens on the port: the database may be starting (a compose
    # file), so the worker waits, however long, until stopped.
    url = urlunsplit(urlsplit(PG_URL)._replace(netloc=f"postgres@127.0.0.1:{_free_port()}"))
    with _worker(url) as proc:
        try:
            time.sleep(4)
            assert proc.poll() is None, proc.communicate()[1]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                _, stderr = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
    assert stderr.count("database unavailable at start") >= 2, stderr
    assert "Connection refused" in stderr
    assert proc.returncode == 0, stderr


def test_a_worker_on_a_sqlite_path_in_a_missing_directory_exits_naming_it(tmp_path):
    directory = tmp_path / "not-made"
    url = f"sqlite:///{directory / 'jobs.db'}"
    with _worker(url) as proc:
        try:
            _, stderr = proc.communicate(timeout=EXIT_WITHIN)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 1, stderr
    line = _error_line(stderr)
    assert f"directory {str(directory)!r} does not exist" in line
    # migrate says the same, in-process too, and not as an outage.
    migrate = _jobkeeper("--database", url, "migrate")
    assert f"directory {str(directory)!r} does not exist -- create it" in migrate.stderr
    jq = JobQueue(url)
    try:
        with pytest.raises(DatabaseError, match="does not exist -- create it") as raised:
            jq.migrate()
        assert not isinstance(raised.value, DatabaseUnavailable)
    finally:
        jq.close()
    assert not directory.exists()
