"""jobkeeper behind PgBouncer in transaction pooling mode.

The test starts Debian's ``pgbouncer`` on a free loopback port in front of
the test PostgreSQL (a fresh database per session; PgBouncer does not pass
the ``options`` startup parameter that the other tests use for their
schemas). Enqueue (single, batch, COPY), claim, complete and rescue must all
work through it; LISTEN cannot (a transaction pooler hands each statement to
whichever server connection is free), so each worker must fall back to
polling and say so exactly once in its log; and no statement may fail on
server-side prepared statements (which a transaction pooler before 1.21
breaks: a prepared name is missing, taken, or names another statement).

PgBouncer missing is a failure, never a skip: ``make test`` installs it when
run as root (``apt-get install -y pgbouncer``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from jobkeeper import JobQueue, waiting
from support.db import PG_URL
from support.settings import SOAK, soak_env
from support.waiting import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = os.environ.get("JOBKEEPER_TEST_BACKENDS", "sqlite,postgres")
MISSING = (
    "pgbouncer is not installed, and the PgBouncer tests need it: install it with "
    "`apt-get install -y pgbouncer` (Debian/Ubuntu; `make test` does this when run as root)"
)
GIVE_UP = "LISTEN/NOTIFY is not delivering"

if "postgres" not in BACKENDS:
    pytestmark = [pytestmark, pytest.mark.skip(reason="JOBKEEPER_TEST_BACKENDS excludes postgres")]


def require_pgbouncer(
    which: Callable[[str], str | None] = shutil.which,
    candidates: Sequence[str] = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"),
) -> str:
    """The pgbouncer binary; fails the test (never skips) when there is none."""
    found = which("pgbouncer")
    if found:
        return found
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(MISSING, pytrace=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def version_of(binary: str) -> tuple[int, ...]:
    text = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


class Bouncer:
    def __init__(self, url: str, log: Path, version: tuple[int, ...], database: str) -> None:
        self.url = url
        self.log = log
        self.version = version
        self.database = database
        # The server's own log, where readable (Debian's default location):
        # its error lines name the database ("%u@%d" in log_line_prefix).
        self.server_logs = {
            path: path.stat().st_size
            for path in Path("/var/log/postgresql").glob("postgresql-*.log")
            if os.access(path, os.R_OK)
        }

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def server_log_lines(self) -> list[str]:
        """Lines the server logged for our database since the fixture started."""
        lines = []
        for path, offset in self.server_logs.items():
            with path.open("rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            lines += [line for line in text.splitlines() if f"@{self.database} " in line]
        return lines


@pytest.fixture(scope="module")
def bouncer() -> Iterator[Bouncer]:
    binary = require_pgbouncer()
    server = conninfo_to_dict(PG_URL)
    database = f"jk_pgbouncer_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    # Not under pytest's tmp dir: PgBouncer runs as "postgres" when we are
    # root, and pytest's directories are private to us.
    directory = Path(tempfile.mkdtemp(prefix="jobkeeper-pgbouncer-"))
    as_root = os.geteuid() == 0
    port = free_port()
    version = version_of(binary)
    lines = [
        "[databases]",
        f"jk = host={server.get('host', '127.0.0.1')} port={server.get('port', 5432)} "
        f"dbname={database} user={server.get('user', 'postgres')}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = any",
        "pool_mode = transaction",
        # Few server connections for many clients: consecutive statements of
        # one client land on different server sessions.
        "default_pool_size = 4",
        "max_client_conn = 200",
        "ignore_startup_parameters = extra_float_digits",
        f"logfile = {directory / 'pgbouncer.log'}",
        f"pidfile = {directory / 'pgbouncer.pid'}",
    ]
    if version >= (1, 21):
        lines.append("max_prepared_statements = 200")
    ini = directory / "pgbouncer.ini"
    ini.write_text("\n".join(lines) + "\n")
    if as_root:
        # PgBouncer refuses to run as root.
        shutil.chown(directory, "postgres")
        for path in directory.iterdir():
            shutil.chown(path, "postgres")
    # Popen's user= (not runuser) so that our signals reach PgBouncer itself.
    as_postgres = {"user": "postgres", "group": "postgres", "extra_groups": []} if as_root else {}
    with (directory / "stderr.log").open("wb") as stderr:
        proc = subprocess.Popen(
            [binary, str(ini)], stdout=subprocess.DEVNULL, stderr=stderr, **as_postgres
        )
    url = f"postgresql://postgres@127.0.0.1:{port}/jk"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    output = "\n".join(
                        path.read_text(errors="replace") for path in directory.glob("*.log")
                    )
                    pytest.fail(f"pgbouncer did not start:\n{output}", pytrace=False)
                time.sleep(0.1)
        yield Bouncer(url, directory / "pgbouncer.log", version, database)
    finally:
        proc.send_signal(signal.SIGTERM)  # immediate shutdown (SIGINT waits for clients)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        shutil.rmtree(directory, ignore_errors=True)


def start_worker(
    url: str, log: Path, *queues: str, concurrency: int = 4
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBKEEPER_DATABASE_URL": url,
        **soak_env(SOAK),
    }
    command = [sys.executable, "-m", "jobkeeper", "--database", url, "worker"]
    command += ["--app", "benchmarks.soak.app:jq", "--concurrency", str(concurrency)]
    for queue in queues:
        command += ["--queue", queue]
    with log.open("wb") as stderr:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )


def test_missing_pgbouncer_fails_with_the_install_command():
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y pgbouncer"):
        require_pgbouncer(which=lambda name: None, candidates=())


def test_enqueue_claim_complete_and_rescue_through_pgbouncer(bouncer, tmp_path):
    jq = JobQueue(bouncer.url, **SOAK)
    assert jq.migrate() >= 1
    # Every API statement runs well past psycopg's prepare threshold (5).
    singles = [jq.enqueue("soak.work", {"n": i, "ms": 1}) for i in range(20)]
    batch = jq.enqueue_many([("soak.work", {"n": 100 + i, "ms": 1}) for i in range(10)])
    copied = jq.enqueue_many([("soak.noop", {"n": 200 + i}) for i in range(200)])  # COPY
    keyed = [jq.enqueue("soak.noop", {"n": 500}, unique_key="same") for _ in range(6)]
    assert len({j.id for j in keyed}) == 1
    stalled = jq.enqueue("soak.stall", {"n": 900, "seconds": 60}, queue="stall")
    for _ in range(6):
        assert jq.get_job(stalled.id) is not None
        jq.stats()

    # Worker A takes the stalling job and is SIGKILLed holding it.
    log_a, log_b = tmp_path / "worker-a.log", tmp_path / "worker-b.log"
    worker_a = start_worker(bouncer.url, log_a, "stall", concurrency=1)
    worker_b = None
    try:
        wait_for(
            lambda: (j := jq.get_job(stalled.id)) is not None and j.status.value == "running",
            timeout=30,
            what="worker A to claim the stalling job",
        )
        worker_a.kill()
        worker_a.wait()
        # Worker B rescues it (through PgBouncer), then runs everything.
        worker_b = start_worker(bouncer.url, log_b, "default", "stall")
        every = [*singles, *batch, *copied, keyed[0], stalled]
        wait_for(
            lambda: all(
                (j := jq.get_job(job.id)) is not None and j.status.value == "completed"
                for job in every
            ),
            timeout=60,
            what="every job to complete",
        )
        rescued = jq.get_job(stalled.id)
        assert rescued is not None
        assert rescued.attempt == 2
        assert [str(e["error"]).split(" ")[:2] for e in rescued.errors] == [["worker", "lost:"]]
        # LISTEN cannot work through a transaction pooler: the canary of the
        # first LISTEN connection, found to be the pooler's, gives up and says so.
        wait_for(
            lambda: GIVE_UP in log_b.read_text(), timeout=40, what="the LISTEN fallback message"
        )
        # Polling still finds new work at once.
        late = jq.enqueue("soak.work", {"n": 1000, "ms": 1})
        wait_for(
            lambda: (j := jq.get_job(late.id)) is not None and j.status.value == "completed",
            timeout=10,
            what="a job enqueued after the fallback",
        )
        worker_b.terminate()
        assert worker_b.wait(30) == 0
    finally:
        for proc in (worker_a, worker_b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        jq.close()
    text_b = log_b.read_text()
    logs = log_a.read_text() + text_b
    assert text_b.count(GIVE_UP) == 1, text_b
    # No fresh LISTEN connections tried: each would stay on a pooled session.
    assert "reconnecting the listener" not in text_b, text_b
    assert "prepared statement" not in logs, logs
    assert "Traceback" not in logs, logs
    assert " ERROR " not in logs, logs
    assert "prepared statement" not in bouncer.log_text()
    server_errors = [line for line in bouncer.server_log_lines() if "prepared statement" in line]
    assert server_errors == []


WAIT_GIVE_UP = "wait: LISTEN/NOTIFY does not reach this process"


def test_wait_through_a_transaction_pooler_polls(bouncer, tmp_path, monkeypatch, caplog):
    # A waiter that counted on a wake-up would sleep out its recheck: make
    # that an hour, so only polling can end these waits.
    monkeypatch.setattr(waiting, "RECHECK", 3600.0)
    jq = JobQueue(bouncer.url, **{**SOAK, "poll_interval": 0.2})
    jq.migrate()
    worker = start_worker(bouncer.url, tmp_path / "worker.log", "default")
    try:
        results: dict[str, object] = {}

        def wait_both() -> None:
            first = jq.enqueue("soak.work", {"n": 1, "ms": 1})
            results["sync"] = jq.wait(first.id)
            second = jq.enqueue("soak.work", {"n": 2, "ms": 1})
            results["async"] = asyncio.run(jq.wait_async(second.id))

        def warnings() -> list[str]:
            return [r.getMessage() for r in caplog.records if WAIT_GIVE_UP in r.getMessage()]

        with caplog.at_level(logging.WARNING, logger="jobkeeper.postgres"):
            waiter = threading.Thread(target=wait_both, daemon=True)
            waiter.start()
            waiter.join(60)
            assert not waiter.is_alive(), "a wait through the pooler never returned"
            assert sorted(results) == ["async", "sync"]
            # Waits poll from the start; the canary then gives up, once.
            wait_for(lambda: warnings(), timeout=20, what="the waiter's polling message")
            again = jq.enqueue("soak.work", {"n": 3, "ms": 1})
            assert jq.wait(again.id, timeout=30) is not None
        assert len(warnings()) == 1, warnings()
        assert not jq.backend.completion_watch().ready
    finally:
        worker.kill()
        worker.wait()
        jq.close()


def test_a_non_iso_datestyle_is_set_to_iso_for_this_client_only(bouncer, monkeypatch):
    # psycopg reads timestamps only in ISO; our sessions set it. Through a
    # transaction pooler that is safe because PgBouncer tracks DateStyle per
    # client (one of the parameters it tracks by default) and sets it on
    # whichever server connection serves the client; other clients keep theirs.
    with psycopg.connect(PG_URL) as server:
        default = server.execute("SHOW DateStyle").fetchone()[0]
    monkeypatch.setenv("PGDATESTYLE", "SQL, DMY")
    with psycopg.connect(bouncer.url) as plain:
        assert plain.info.parameter_status("DateStyle") == "SQL, DMY"
    jq = JobQueue(bouncer.url, pool_size=4)
    try:
        jq.migrate()
        ids = [jq.enqueue("soak.noop", {"n": i}, queue="datestyle").id for i in range(12)]
        ids += [job.id for job in jq.enqueue_many([("soak.noop", {}, {"queue": "datestyle"})] * 3)]
        with ThreadPoolExecutor(4) as pool:  # over several server connections
            read = list(pool.map(jq.get_job, ids * 4))
        assert all(job is not None and job.created_at is not None for job in read)
        assert {job.id for job in jq.list_jobs(queue="datestyle", limit=100)} == set(ids)
    finally:
        jq.close()
    monkeypatch.delenv("PGDATESTYLE")
    others = [psycopg.connect(bouncer.url, autocommit=True) for _ in range(4)]
    try:
        seen = {c.execute("SHOW DateStyle").fetchone()[0] for c in others * 5}
    finally:
        for conn in others:
            conn.close()
    assert seen == {default}


@pytest.mark.parametrize(
    ("tail", "names"),
    [
        ("?options=-c%20search_path%3Dtenant", "unsupported startup parameter: options"),
        ("_not_listed", "[databases]"),
    ],
    ids=["options", "unknown-database"],
)
def test_a_worker_through_pgbouncer_refused_for_good_exits_at_once(bouncer, tail, names):
    # PgBouncer refuses the URL's options (what the schema-per-tenant URLs
    # use) and a database it does not list, every time: the worker says so
    # and exits 1 instead of waiting for ever, and migrate says the same.
    url = bouncer.url + tail
    command = [sys.executable, "-m", "jobkeeper", "--database", url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    worker = subprocess.run(
        [*command, "worker", "--app", "benchmarks.soak.app:jq"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert worker.returncode == 1, worker.stderr
    assert time.monotonic() - started < 15
    assert "Traceback" not in worker.stderr
    line = worker.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "refused the connection" in line and names in line
    assert "database unavailable at start" not in worker.stderr
    migrate = subprocess.run(
        [*command, "migrate"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert migrate.returncode == 1
    assert migrate.stderr.strip() == line
