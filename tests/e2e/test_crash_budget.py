"""The crash budget with real worker processes (DESIGN.md, "Poison jobs"): a
job rescued from a worker that died under it runs its next attempt alone, so
a crash then is pinned on it; after ``max_crashes`` pinned crashes it is dead,
attempts left or not, and the jobs that only shared a worker with it are
never charged.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from jobkeeper import JobQueue, JobStatus
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for

from .helpers import Procs, processes, read_records, wait_exit, workers_by_pid

pytestmark = pytest.mark.slow

Record = tuple[int, int, int, str]


def _ran_alone(records: list[Record], job_id: int, attempt: int) -> bool:
    """Whether that attempt ran with no other job on its worker process: none
    open there when it started, none started there before it ended (or, for
    an attempt that killed its worker, ever after: the process was gone).
    Records are in the order they were written (one O_APPEND file).
    """
    starts = [i for i, r in enumerate(records) if r[:2] == (job_id, attempt) and r[3] == "start"]
    assert len(starts) == 1, (job_id, attempt, records)
    begin = starts[0]
    pid = records[begin][2]
    mine = [r for r in records if r[2] == pid]
    index = mine.index(records[begin])
    open_before = {(r[0], r[1]) for r in mine[:index] if r[3] == "start"} - {
        (r[0], r[1]) for r in mine[:index] if r[3] == "end"
    }
    # (A pid serves one process: an attempt it started and never ended was
    # its last, so nothing started there before this is still open.)
    if open_before:
        return False
    for r in mine[index + 1 :]:
        if (r[0], r[1]) == (job_id, attempt):
            return True  # its end: nothing started in between
        if r[3] == "start":
            return False
    return True  # it never ended: it took its worker down with it


class Supervisor:
    """Keeps ``count`` workers running: restarts any that died (each death a
    SIGKILL), counting the deaths.
    """

    def __init__(self, procs: Procs, url: str, count: int, concurrency: int) -> None:
        self._procs = procs
        self._url = url
        self._concurrency = concurrency
        self.deaths = 0
        self.workers = [self._start() for _ in range(count)]

    def _start(self) -> subprocess.Popen[bytes]:
        return self._procs.worker(self._url, FAST, concurrency=self._concurrency)

    def until(self, done: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            for index, proc in enumerate(self.workers):
                if proc.poll() is not None:
                    assert proc.returncode == -signal.SIGKILL, self._procs.log(proc)
                    self.deaths += 1
                    self.workers[index] = self._start()
            return done()

        return check


def _status(jq: JobQueue, job_id: int) -> JobStatus:
    job = jq.get_job(job_id)
    assert job is not None
    return job.status


def test_poison_job_is_dead_after_max_crashes_and_its_neighbours_are_not_charged(
    make_queue: Callable[..., JobQueue], tmp_path: Path
) -> None:
    jq = make_queue()
    url = jq.url.url
    record = str(tmp_path / "runs.log")
    innocents = [j.id for j in jq.enqueue_many([("slept", {"seconds": 2.5, "record": record})] * 3)]
    poison = jq.enqueue("poison", {"delay": 0.8, "record": record}).id
    with processes(tmp_path) as procs:
        # One worker first, holding all four: the poison's first crash takes
        # the three innocents' running attempts down with it.
        first = procs.worker(url, FAST, concurrency=4)
        wait_for(
            lambda: len(read_records(Path(record))) >= 4,
            what="the first worker to start all four jobs",
        )
        first_id = workers_by_pid(url)[first.pid]
        assert wait_exit(first) == -signal.SIGKILL
        rows = sql(url, "SELECT id, status, worker_id FROM jobkeeper_jobs ORDER BY id")
        # Frozen (nobody alive to rescue them yet): all four running there.
        assert {(int(i), str(s), str(w)) for i, s, w in rows} == {
            (i, "running", first_id) for i in [*innocents, poison]
        }, rows

        supervisor = Supervisor(procs, url, count=2, concurrency=4)
        wait_for(
            supervisor.until(
                lambda: (
                    _status(jq, poison) == JobStatus.DEAD
                    and all(_status(jq, i) == JobStatus.COMPLETED for i in innocents)
                )
            ),
            timeout=120,
            what="the poison job dead and the innocents completed",
        )
        # The workers stop dying: ordinary jobs complete, both stay up.
        ok = [jq.enqueue("sleep", {"seconds": 0.01}).id for _ in range(4)]
        wait_for(
            supervisor.until(lambda: all(_status(jq, i) == JobStatus.COMPLETED for i in ok)),
            what="ordinary jobs to complete",
        )
        assert all(proc.poll() is None for proc in supervisor.workers)
    records = read_records(Path(record))

    dead = jq.get_job(poison)
    assert dead is not None and dead.status == JobStatus.DEAD
    assert dead.dead_reason is not None
    assert "crashed its worker 2 times (max_crashes=2)" in dead.dead_reason, dead.dead_reason
    # Attempt 1 ran beside the innocents (a lost attempt, not a crash); 2 and
    # 3 ran alone and were pinned: dead at attempt 3 of 20.
    assert [e["attempt"] for e in dead.errors] == [1, 2, 3], dead.errors
    assert dead.attempt == 3 and dead.crashes == 2
    assert f"worker lost: {first_id}" in dead.errors[0]["error"]
    assert "not counted as a crash" in dead.errors[0]["error"]
    assert "crashed its worker 1 time (max_crashes=2)" in dead.errors[1]["error"]
    assert "crashed its worker 2 times" in dead.errors[2]["error"]
    assert _ran_alone(records, poison, 2) and _ran_alone(records, poison, 3)
    # The exact bound: three attempts, three worker deaths, no free return
    # (a lone attempt's start mark is written before its task is called, and
    # the first one's was flushed during its 0.8 s nap).
    assert [r[1] for r in records if r[0] == poison] == [1, 2, 3]
    assert supervisor.deaths == 2  # plus the first worker

    for job_id in innocents:
        done = jq.get_job(job_id)
        assert done is not None and done.status == JobStatus.COMPLETED, done
        assert done.crashes == 0, done
        # Its one lost attempt, at the poison's first crash, on that worker.
        assert len(done.errors) == 1, done.errors
        assert done.errors[0]["attempt"] == 1
        assert f"worker lost: {first_id}" in done.errors[0]["error"]
        assert "not counted as a crash" in done.errors[0]["error"]
        assert done.attempt == 2 and done.result == 2
        assert _ran_alone(records, job_id, 2)


def test_job_rescued_once_runs_alone_once_then_normally(
    make_queue: Callable[..., JobQueue], tmp_path: Path
) -> None:
    jq = make_queue()
    url = jq.url.url
    record = str(tmp_path / "runs.log")
    # Attempt 1 is cut short by an outside SIGKILL; attempt 2 (alone) raises;
    # attempt 3 runs as any job does and completes.
    ids = [
        j.id
        for j in jq.enqueue_many([("slept", {"seconds": 1.0, "record": record, "fail_on": 2})] * 4)
    ]
    with processes(tmp_path) as procs:
        first = procs.worker(url, FAST, concurrency=4)
        wait_for(
            lambda: all(_status(jq, i) == JobStatus.RUNNING for i in ids),
            what="all four jobs running on the first worker",
        )
        first.send_signal(signal.SIGKILL)
        assert wait_exit(first) == -signal.SIGKILL
        # Two workers with room for all four: only the crash budget keeps
        # each job's second attempt alone on its worker.
        supervisor = Supervisor(procs, url, count=2, concurrency=4)
        wait_for(
            supervisor.until(lambda: all(_status(jq, i) == JobStatus.COMPLETED for i in ids)),
            timeout=60,
            what="all four jobs to complete",
        )
        assert supervisor.deaths == 0
    records = read_records(Path(record))
    for job_id in ids:
        done = jq.get_job(job_id)
        assert done is not None and done.status == JobStatus.COMPLETED, done
        assert done.crashes == 0 and not done.run_alone, done
        assert done.attempt == 3 and done.result == 3
        assert [e["attempt"] for e in done.errors] == [1, 2], done.errors
        assert "worker lost" in done.errors[0]["error"]
        assert "RuntimeError: fails on attempt 2" in done.errors[1]["error"]
        assert _ran_alone(records, job_id, 2)


def test_a_job_its_stopping_worker_gave_up_on_is_charged_no_crash(db_url, tmp_path):
    # helper-81: a job blocked in C, stopped by deploys (SIGTERM twice, "did
    # not return ... stay held"), was dead-lettered as "crashed its worker"
    # once a lone attempt of it had been given up on that way.
    record = str(tmp_path / "records")
    with JobQueue(db_url, **FAST) as jq:
        jq.migrate()
        job = jq.enqueue("blocked_in_c", {"seconds": 30, "record": record})
        for stop in range(1, 3):
            with processes(tmp_path) as procs:
                worker = procs.worker(db_url, FAST, concurrency=2)
                wait_for(
                    lambda n=stop: len(read_records(Path(record))) == n,
                    timeout=60,
                    what=f"attempt {stop} to start",
                )
                worker.send_signal(signal.SIGTERM)
                worker.send_signal(signal.SIGTERM)
                assert wait_exit(worker) == 1  # one job left held
                assert "stay held by this worker" in procs.log(worker)
            # Rescued by the next worker, rescue_after (1 s) past the last beat.
        with processes(tmp_path) as procs:
            procs.worker(db_url, FAST, concurrency=2)
            # Attempt 2 ran alone: charged a crash, the job would be dead here.
            wait_for(lambda: len(read_records(Path(record))) == 3, timeout=60, what="attempt 3")
            rescued = jq.get_job(job.id)
    assert rescued is not None and rescued.crashes == 0 and rescued.attempt == 3
    assert [e["attempt"] for e in rescued.errors] == [1, 2]
    assert all("not counted as a crash" in e["error"] for e in rescued.errors), rescued.errors
