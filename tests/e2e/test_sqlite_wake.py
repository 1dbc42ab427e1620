"""SQLite's wake channel between real processes (see
``jobkeeper.backends.sqlite.wakechannel``): an enqueue in one process wakes a
worker process at once, a dead process's socket is skipped and removed, and
where no channel can be made the worker falls back to polling data_version.

The workers that must be woken through the channel run with every poll set
to an hour (a module-attribute hook and ``poll_interval``), so a job that
starts at all within the tests' deadline was started by a datagram.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from jobkeeper import JobQueue, JobStatus
from jobkeeper.backends.sqlite import wakechannel
from support.waiting import wait_for

from .helpers import APP, Procs, processes, wait_exit

pytestmark = pytest.mark.slow

HOUR = 3600.0
# A worker whose listener reads data_version once an hour and whose producer
# stages once an hour: only a wake-up reaches it.
DEAF_WORKER = f"""
import sys
from jobkeeper.backends.sqlite import wakeups
wakeups.CHANGE_POLL = wakeups.CHANNEL_POLL = {HOUR}
from jobkeeper.cli.main import main
main(["--database", sys.argv[1], "worker", "--app", "{APP}", "--concurrency", "2"])
"""
DEAF_SETTINGS = {"poll_interval": HOUR}


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


def _sockets_of(db: Path, pid: int) -> list[Path]:
    directory = Path(wakechannel.directory_of(str(db)))
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f"{pid}-*{wakechannel.SOCKET_SUFFIX}"))


def _deaf_worker(procs: Procs, url: str, db: Path) -> Any:
    worker = procs.python(DEAF_WORKER, url, settings=DEAF_SETTINGS)
    wait_for(lambda: _sockets_of(db, worker.pid), what="the worker's wake socket")
    return worker


def _ran(jq: JobQueue, job_id: int) -> bool:
    job = jq.get_job(job_id)
    return job is not None and job.status == JobStatus.COMPLETED


def test_an_enqueue_in_another_process_wakes_a_worker_that_never_polls(tmp_path):
    db = tmp_path / "jobs.db"
    with JobQueue(_url(tmp_path)) as jq, processes(tmp_path) as procs:
        jq.migrate()
        worker = _deaf_worker(procs, _url(tmp_path), db)
        # One after another: each job is enqueued while the worker waits, so
        # each start needs a wake-up of its own.
        for n in range(3):
            job = jq.enqueue("sleep", {"seconds": 0})
            wait_for(lambda job_id=job.id: _ran(jq, job_id), what=f"job {n} to run")
        (socket_file,) = _sockets_of(db, worker.pid)
        worker.send_signal(signal.SIGTERM)
        assert wait_exit(worker) == 0
        assert not socket_file.exists(), "a stopped worker leaves its socket behind"


def test_the_socket_of_a_killed_worker_is_skipped_and_removed(tmp_path):
    db = tmp_path / "jobs.db"
    with JobQueue(_url(tmp_path)) as jq, processes(tmp_path) as procs:
        jq.migrate()
        killed = procs.worker(_url(tmp_path), {})
        wait_for(lambda: _sockets_of(db, killed.pid), what="the first worker's wake socket")
        (stale,) = _sockets_of(db, killed.pid)
        killed.send_signal(signal.SIGKILL)
        wait_exit(killed)
        assert stale.exists()
        worker = _deaf_worker(procs, _url(tmp_path), db)
        job = jq.enqueue("sleep", {"seconds": 0})
        # Removed by the enqueue's own send, before it returned.
        assert not stale.exists()
        wait_for(lambda: _ran(jq, job.id), what="the job to run on the live worker")
        worker.send_signal(signal.SIGTERM)
        assert wait_exit(worker) == 0


def _block_the_channel(db: Path, how: str) -> None:
    directory = Path(wakechannel.directory_of(str(db)))
    if how == "file in the way":
        directory.write_text("")
    elif os.geteuid() == 0:
        # Root writes anywhere: another user's directory is what stops it.
        directory.mkdir(mode=0o700)
        os.chown(directory, 65534, 65534)
    else:
        directory.mkdir(mode=0o500)


@pytest.mark.parametrize("how", ["file in the way", "not ours to write"])
def test_with_no_channel_a_worker_process_polls_and_says_so_once(tmp_path, how):
    db = tmp_path / "jobs.db"
    with JobQueue(_url(tmp_path)) as jq, processes(tmp_path) as procs:
        jq.migrate()
        _block_the_channel(db, how)
        worker = procs.worker(_url(tmp_path), {})
        for n in range(2):
            job = jq.enqueue("sleep", {"seconds": 0})
            wait_for(lambda job_id=job.id: _ran(jq, job_id), what=f"job {n} to run by polling")
        worker.send_signal(signal.SIGTERM)
        assert wait_exit(worker) == 0
        assert procs.log(worker).count("no wake channel beside") == 1


def _listen_until_a_commit_elsewhere_is_heard(jq: JobQueue, db: Path) -> None:
    heard = threading.Event()
    stop = threading.Event()
    backend = jq.backend.dedicated()

    def run() -> None:
        try:
            backend.listen(on_queue=lambda q: heard.set(), stop=stop)
        finally:
            backend.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # Commits of "another process" (a raw connection) until the poll hears one.
    wait_for(lambda: _commit_elsewhere(db) or heard.is_set(), what="the listener to hear a commit")
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


def test_a_listener_with_no_channel_logs_once_and_still_hears_other_connections(tmp_path, caplog):
    db = tmp_path / "jobs.db"
    with JobQueue(_url(tmp_path)) as jq:
        jq.migrate()
        _block_the_channel(db, "file in the way")
        caplog.set_level(logging.INFO, logger="jobkeeper.sqlite")
        _listen_until_a_commit_elsewhere_is_heard(jq, db)
        _listen_until_a_commit_elsewhere_is_heard(jq, db)
    said = [r for r in caplog.records if "no wake channel beside" in r.getMessage()]
    assert len(said) == 1


def _commit_elsewhere(db: Path) -> bool:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS elsewhere (x)")
        conn.execute("INSERT INTO elsewhere VALUES (1)")
    finally:
        conn.close()
    return False


def test_a_listener_binds_again_when_its_channel_directory_is_removed(tmp_path):
    db = tmp_path / "jobs.db"
    with JobQueue(_url(tmp_path)) as jq:
        jq.migrate()
        stop = threading.Event()
        backend = jq.backend.dedicated()

        def run() -> None:
            try:
                backend.listen(on_queue=lambda q: None, stop=stop)
            finally:
                backend.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            (first,) = wait_for(lambda: _sockets_of(db, os.getpid()), what="the socket")
            shutil.rmtree(first.parent)
            (again,) = wait_for(lambda: _sockets_of(db, os.getpid()), what="a socket again")
            assert again != first
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()
        assert not _sockets_of(db, os.getpid())
