"""Real worker processes: three workers of one app, some SIGKILLed and
restarted mid-run; every tick in the window is enqueued exactly once, none
missing. And an in-process worker with retention=0, whose completed jobs are
deleted at once, never fires a tick twice.
"""

from __future__ import annotations

import signal
import sys
import time
from collections import Counter
from datetime import timedelta

import pytest

from e2e.helpers import processes, wait_exit
from jobkeeper import current_job
from support.settings import FLEET
from support.waiting import wait_for
from worker.helpers import running

from .helpers import ticks

pytestmark = pytest.mark.slow

APP = "tests.periodic.apps:jq"


def test_three_workers_with_sigkills_enqueue_each_tick_once(jq, tmp_path):
    url = jq.url.url
    argv = [sys.executable, "-m", "jobkeeper", "--database", url, "worker", "--app", APP]
    argv += ["--concurrency", "2"]
    with processes(tmp_path) as procs:

        def start() -> object:
            return procs.spawn(argv, settings=FLEET, name="worker")

        fleet = [start() for _ in range(3)]
        wait_for(lambda: len(ticks(url, "beat")) >= 2, what="the first ticks")
        # Two of three die at once; a survivor keeps ticking, then they return.
        for proc in fleet[:2]:
            proc.send_signal(signal.SIGKILL)
            assert wait_exit(proc) == -signal.SIGKILL
        time.sleep(2.5)
        fleet = [fleet[2], start(), start()]
        time.sleep(2.5)
        # The last of the first generation dies; one more returns.
        fleet[0].send_signal(signal.SIGKILL)
        assert wait_exit(fleet[0]) == -signal.SIGKILL
        fleet = [*fleet[1:], start()]
        time.sleep(2.5)
        # A worker SIGTERMed while still importing (a loaded machine took
        # longer than the sleep) dies of the signal before its handlers are
        # installed: stop the fleet once every worker has registered.
        wait_for(
            lambda: {p.pid for p in fleet} <= {w.pid for w in jq.workers()},
            what="every worker registered",
        )
        for proc in fleet:
            proc.send_signal(signal.SIGTERM)
        for proc in fleet:
            assert wait_exit(proc) == 0, procs.log(proc)

    beats = ticks(url, "beat")
    per_tick = Counter(beats)
    assert [t for t, n in per_tick.items() if n > 1] == []  # never twice
    first, last = min(beats), max(beats)
    span = int((last - first).total_seconds())
    assert span >= 7, beats
    assert sorted(beats) == [first + timedelta(seconds=i) for i in range(span + 1)]  # none missing
    assert all(t.microsecond == 0 for t in beats)
    minutes = ticks(url, "minute")
    assert len(minutes) == len(set(minutes)) <= 1
    assert all(t.second == 0 for t in minutes)


def test_deleting_completed_jobs_does_not_refire_a_tick(make_queue):
    jq = make_queue(retention=0)
    ran: list[object] = []

    @jq.periodic(every=1)
    @jq.task()
    def beat() -> None:
        ran.append(current_job().scheduled_at)

    worker = jq.worker(concurrency=2)
    assert worker.periodic in worker._services
    with running(worker):
        wait_for(lambda: len(ran) >= 3, timeout=30, what="three ticks to run")
        assert worker.periodic.wait_passes(worker.periodic.loop_passes + 2, timeout=10)
    assert len(ran) == len(set(ran)) >= 3
    first = min(ran)
    assert sorted(ran) == [first + timedelta(seconds=i) for i in range(len(ran))]
    # retention=0: the jobs were deleted at completion; the record is the row.
    (row,) = jq.periodic_list()
    assert row.last_tick_at is not None and row.last_tick_at >= max(ran)
