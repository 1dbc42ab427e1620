"""A SQLite file removed or replaced under running processes (break-test:
``rm -rf`` of the database's directory while two workers and a producer ran
them). Before: the producer's enqueues kept returning, into the deleted file,
and the workers kept serving it without a word. Now: no enqueue that starts
after the removal returns (each raises, naming the path), and each worker
stops with exit status 1, saying why.

Real worker subprocesses (``jobkeeper worker``) and a producer subprocess
calling ``enqueue_many`` of 5 in a loop, recording every call's start, end
and outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobkeeper import DatabaseError, JobQueue
from jobkeeper.doctor import run_checks
from support.db import sql
from support.waiting import wait_for

from .helpers import Procs, processes, read_records, wait_exit, workers_by_pid

pytestmark = pytest.mark.slow

SETTINGS = {"heartbeat_interval": 0.2, "rescue_after": 3.0, "poll_interval": 0.2}

# Every call: one JSON line {"start", "end", "ids" | "error"} (times: time.time()).
PRODUCER = """
import json, sys, time, os
from jobkeeper import DatabaseError, JobQueue
from jobkeeper.doctor import run_checks
url, out, record, stop = sys.argv[1:5]
jq = JobQueue(url, external_tasks=True)
with open(out, "a", buffering=1) as log:
    while not os.path.exists(stop):
        start = time.time()
        try:
            jobs = jq.enqueue_many([("record", {"record": record}) for _ in range(5)])
            line = {"ids": [job.id for job in jobs]}
        except Exception as exc:
            line = {"error": f"{type(exc).__name__}: {exc}"}
        line.update(start=start, end=time.time())
        log.write(json.dumps(line) + "\\n")
        time.sleep(0.05)
"""


def _calls(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _start(procs: Procs, tmp_path: Path, url: str) -> tuple[list[subprocess.Popen[bytes]], Path]:
    JobQueue(url).migrate()
    workers = [procs.worker(url, SETTINGS, concurrency=4) for _ in range(2)]
    calls = tmp_path / "calls.jsonl"
    procs.python(
        PRODUCER, url, str(calls), str(tmp_path / "records"), str(tmp_path / "stop"), settings={}
    )
    # Running: both workers started, jobs enqueued and run.
    pids = {worker.pid for worker in workers}
    wait_for(lambda: set(workers_by_pid(url)) >= pids, what="both workers registered")
    wait_for(lambda: len(read_records(tmp_path / "records")) >= 20, what="jobs run")
    return workers, calls


def _stopped_on(procs: Procs, worker: subprocess.Popen[bytes], db: Path, what: str) -> None:
    assert wait_exit(worker, timeout=30) == 1
    log = procs.log(worker)
    assert str(db) in log and what in log, log[-3000:]
    assert "stopping now" in log, log[-3000:]


def test_directory_removed_under_workers_and_a_producer(tmp_path: Path) -> None:
    directory = tmp_path / "db"
    directory.mkdir()
    db = directory / "jobs.db"
    url = f"sqlite:///{db}"
    with processes(tmp_path) as procs:
        workers, calls = _start(procs, tmp_path, url)
        shutil.rmtree(directory)
        removed_at = time.time()
        for worker in workers:
            _stopped_on(procs, worker, db, "was removed")
        # The producer goes on trying for a while after the workers stopped.
        wait_for(
            lambda: sum(call["start"] > removed_at for call in _calls(calls)) >= 10,
            what="calls after the removal",
        )
        (tmp_path / "stop").touch()
        after = [call for call in _calls(calls) if call["start"] > removed_at]
        stored = [call for call in after if "ids" in call]
        assert stored == [], f"enqueues started after the removal returned: {stored[:3]}"
        # The first says what happened; the later ones that the directory is gone.
        assert str(db) in after[0]["error"]
        assert all("DatabaseError" in c["error"] or "Replaced" in c["error"] for c in after)


def test_file_replaced_under_workers_and_a_producer(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}"
    with processes(tmp_path) as procs:
        workers, calls = _start(procs, tmp_path, url)
        # What a restore (or rm + migrate) does: another file at the path.
        fresh = tmp_path / "fresh.db"
        maker = JobQueue(f"sqlite:///{fresh}")
        maker.migrate()
        maker.close()  # the last connection's close writes the WAL into the file
        assert not Path(f"{fresh}-wal").exists()
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.replace(fresh, db)
        replaced_at = time.time()
        for worker in workers:
            _stopped_on(procs, worker, db, "was replaced by another file")
        wait_for(
            lambda: sum("ids" in c and c["start"] > replaced_at for c in _calls(calls)) >= 5,
            what="enqueues into the new file",
        )
        (tmp_path / "stop").touch()
        # Every call started after the replace that returned jobs stored them
        # in the new file: a worker started on it runs them all. (One that
        # started before may have committed into the old file and passed
        # its check after the commit before the replace: it returned then.)
        after = [call for call in _calls(calls) if call["start"] > replaced_at]
        returned = {job_id for call in after if "ids" in call for job_id in call["ids"]}
        in_new = {int(row[0]) for row in sql(url, "SELECT id FROM jobkeeper_jobs")}
        assert returned <= in_new, sorted(returned - in_new)[:10]
        refused = [call for call in after if "error" in call]
        assert all("DatabaseError" in c["error"] or "Replaced" in c["error"] for c in refused)
        final = procs.worker(url, SETTINGS, concurrency=4, burst=True)
        assert wait_exit(final) == 0, procs.log(final)[-3000:]
        rows = sql(url, "SELECT id, status FROM jobkeeper_jobs")
        assert {int(i) for i, s in rows if s == "completed"} >= returned


# A process of an older jobkeeper, or another program, on the file: it has
# the database open and keeps it open.
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT count(*) FROM jobkeeper_jobs").fetchall()
print("open", flush=True)
time.sleep(120)
"""


def test_doctor_names_a_process_holding_the_removed_file(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}"
    JobQueue(url).migrate()
    with processes(tmp_path) as procs:
        holder = procs.python(HOLDER, str(db))
        wait_for(lambda: "open" in procs.log(holder), what="the holder's open")
        doctor = JobQueue(url)
        before = {c.name: c for c in run_checks(doctor)}
        assert before["removed file"].level == "ok"
        doctor.close()
        for name in ("jobs.db", "jobs.db-wal", "jobs.db-shm"):  # rm jobs.db*
            (tmp_path / name).unlink(missing_ok=True)
        gone = run_checks(JobQueue(url))
        assert gone[0].level == "fail" and "does not exist" in gone[0].message
        assert f"process(es) {holder.pid} still have a removed or replaced copy" in gone[0].message
        JobQueue(url).migrate()  # a new file at the path: the holder keeps the old
        after = {c.name: c for c in run_checks(JobQueue(url))}
        assert after["removed file"].level == "warn"
        assert str(holder.pid) in after["removed file"].message
        holder.kill()
        holder.wait()
        assert {c.name: c for c in run_checks(JobQueue(url))}["removed file"].level == "ok"


def _migrate(url: str) -> None:
    """A migrate that leaves no connection open in this process."""
    with JobQueue(url) as jq:
        jq.migrate()


def test_migrate_beside_the_wal_of_a_removed_file_still_open(tmp_path: Path) -> None:
    """``rm jobs.db`` under a running worker leaves ``jobs.db-wal`` and
    ``jobs.db-shm``, which it still has open. A ``migrate`` then made a new
    file sharing them: SQLite failed with a bare "disk I/O error" (or read the
    removed file's pages as the new one's). It is refused, naming the files
    and the process, until that process is gone; then it works.
    """
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}"
    _migrate(url)
    with processes(tmp_path) as procs:
        worker = procs.worker(url, SETTINGS, concurrency=2)
        wait_for(lambda: worker.pid in workers_by_pid(url), what="the worker registered")
        producer = JobQueue(url, external_tasks=True)
        # Past SQLite's checkpoint (1,000 pages): the removed file holds pages
        # the WAL does not.
        for _ in range(8):
            producer.enqueue_many(
                [("sleep", {"seconds": 60, "pad": "x" * 500}, {"queue": "elsewhere"})] * 1000
            )
        producer.close()
        os.kill(worker.pid, signal.SIGSTOP)  # a worker that has not looked yet
        db.unlink()
        assert Path(f"{db}-wal").exists() and Path(f"{db}-shm").exists()
        with pytest.raises(DatabaseError) as refused:
            _migrate(url)
        message = str(refused.value)
        assert "jobs.db-wal and jobs.db-shm" in message and str(worker.pid) in message, message
        assert "disk I/O" not in message.split("(SQLite fails")[0]
        assert not db.exists()  # nothing created
        os.kill(worker.pid, signal.SIGCONT)
        _stopped_on(procs, worker, db, "was removed")
        # The worker gone, its -wal and -shm belong to no process: migrate
        # works, and the new file is a new, empty database.
        _migrate(url)
        assert sql(url, "SELECT count(*) FROM jobkeeper_jobs") == [(0,)]
        assert sql(url, "PRAGMA integrity_check") == [("ok",)]
        with JobQueue(url, external_tasks=True) as jq:
            jq.enqueue("record", {"record": str(tmp_path / "r")})
        final = procs.worker(url, SETTINGS, concurrency=2, burst=True)
        assert wait_exit(final) == 0, procs.log(final)[-3000:]
        assert len(read_records(tmp_path / "r")) == 1


def test_a_worker_stopped_by_its_removed_file_says_where_its_jobs_are(tmp_path: Path) -> None:
    """Its stop said "those jobs will be rescued and re-run" (and tried for
    seconds to write their outcomes, to resign its lease, to deregister):
    nothing rescues them, they are in the removed file. Its lines say that,
    naming the file.
    """
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}"
    records = tmp_path / "records"
    _migrate(url)
    with processes(tmp_path) as procs:
        worker = procs.worker(url, SETTINGS, concurrency=2)
        with JobQueue(url, external_tasks=True) as jq:
            jq.enqueue("sleep", {"seconds": 60, "record": str(records)})
            jq.enqueue("blocked_in_c", {"seconds": 60, "record": str(records)})
        wait_for(lambda: len(read_records(records)) == 2, what="both jobs running")
        db.unlink()
        assert wait_exit(worker, timeout=30) == 1
        log = procs.log(worker)
        stop = log[log.index("\n", log.index("stopping now")) :]  # the lines after it
        where = f"in the removed file {str(db)!r}, where nothing rescues them"
        assert f"outcomes still unwritten at shutdown; their jobs are {where} or runs" in stop
        assert (
            f"did not return 2s after being interrupted at shutdown and stay held by this "
            f"worker, {where} (not handed back" in stop
        ), stop
        for untrue in ("will be rescued", "to be rescued", "migrate", "resign", "deregister"):
            assert untrue not in stop, (untrue, stop)


# A worker whose file is replaced just after it registered, before its
# other connections (heartbeat, outcomes, leader...) are opened.
REPLACED_AT_START = """
import os, sys
from jobkeeper import JobQueue
from jobkeeper.worker import runner
url, fresh = sys.argv[1:3]
path = url.removeprefix("sqlite:///")
jq = JobQueue(url, heartbeat_interval=0.2, rescue_after=3.0, poll_interval=0.2)

@jq.task
def noop() -> None:
    pass

register = runner.register_when_reachable

def register_then_replace(*args, **kwargs):
    registered = register(*args, **kwargs)
    for suffix in ("-wal", "-shm"):
        os.unlink(path + suffix)
    os.replace(fresh, path)
    print("replaced", flush=True)
    return registered

runner.register_when_reachable = register_then_replace
jq.run_worker(concurrency=2)
"""


def test_a_file_replaced_while_the_worker_starts_stops_it(tmp_path: Path) -> None:
    """Each of a worker's connections kept to the file it opened first: one
    opened after a replace (its heartbeat's, just after its registration)
    served the new file. The worker then beat and registered itself in the
    new file while its claims read the removed one: alive for ``doctor``,
    it never ran a job enqueued there. Now every connection of the worker
    keeps to the file at the path when it was made, and it stops.
    """
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}"
    fresh = tmp_path / "fresh.db"
    _migrate(url)
    _migrate(f"sqlite:///{fresh}")
    with processes(tmp_path) as procs:
        worker = procs.python(REPLACED_AT_START, url, str(fresh))
        wait_for(lambda: "replaced" in procs.log(worker), what="the replace")
        assert wait_exit(worker, timeout=30) == 1, procs.log(worker)[-3000:]
        log = procs.log(worker)
        assert "not the file this worker started on" in log and "stopping now" in log, log
        assert sql(url, "SELECT count(*) FROM jobkeeper_workers") == [(0,)]
