"""Per-queue shares of one worker (``--queue emails=5``, ``run_worker(queues=
{"emails": 5})``): a queue never runs past its share, prefetch does not hoard
past it, the other queues keep the remaining slots, and bad shares are refused
with the field and value named (exit code 2 on the CLI)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from e2e.helpers import Procs, processes
from jobkeeper import ConfigError, JobQueue
from jobkeeper.cli.main import main
from jobkeeper.worker.runner import Worker
from support.waiting import wait_for

from .test_workers import APP, SETTINGS, done, most_overlapping, records


def spawn(procs: Procs, url: str, queues: list[str], *, concurrency: int):
    argv = [sys.executable, "-m", "jobkeeper", "--database", url, "worker", "--app", APP]
    argv += ["--concurrency", str(concurrency)]
    for queue in queues:
        argv += ["--queue", queue]
    return procs.spawn(argv, settings=SETTINGS, name="worker")


def timed_jobs(record: Path, queue: str, seconds: float, n: int) -> list[tuple]:
    args = {"seconds": seconds, "record": str(record), "key": queue}
    return [("timed", args, {"queue": queue})] * n


def spans(runs, queue: str | None = None) -> list[tuple[float, float]]:
    return [(s, e) for _, _, s, e, key in runs if queue is None or key == queue]


def test_a_slow_queue_keeps_to_its_share_while_fast_jobs_flow(db_url, tmp_path):
    record = tmp_path / "runs.txt"
    with JobQueue(db_url) as jq:
        jq.migrate()
        # The slow jobs first, and their queue first: with no share they
        # would take all four slots for their first 1.5 s.
        jq.enqueue_many(timed_jobs(record, "slow", 1.5, 8))
        jq.enqueue_many(timed_jobs(record, "fast", 0.02, 40))
        with processes(tmp_path) as procs:
            spawn(procs, db_url, ["slow=2", "fast"], concurrency=4)
            wait_for(lambda: done(db_url) == 48, timeout=120, what="all 48 jobs")
    runs = records(record)
    slow = spans(runs, "slow")
    assert most_overlapping(slow) == 2  # its share, used, never passed
    assert most_overlapping(spans(runs)) <= 4

    def both_slow_running(start: float, end: float) -> bool:
        return sum(1 for s, e in slow if s <= start and end <= e) == 2

    # The fast queue kept the other two slots: most of its jobs ran start to
    # end while both slow slots were busy (the slow queue holds them for 6 s).
    beside = [span for span in spans(runs, "fast") if both_slow_running(*span)]
    assert len(beside) >= 20, (len(beside), sorted(runs, key=lambda r: r[2]))


def test_shares_adding_up_past_the_concurrency_are_caps_not_reservations(db_url, tmp_path):
    record = tmp_path / "runs.txt"
    with JobQueue(db_url) as jq:
        jq.migrate()
        jq.enqueue_many(timed_jobs(record, "a", 0.3, 8) + timed_jobs(record, "b", 0.3, 8))
        with processes(tmp_path) as procs:
            spawn(procs, db_url, ["a=2", "b=2"], concurrency=3)
            wait_for(lambda: done(db_url) == 16, timeout=120, what="all 16 jobs")
    runs = records(record)
    assert most_overlapping(spans(runs, "a")) == 2
    assert most_overlapping(spans(runs, "b")) == 2
    assert most_overlapping(spans(runs)) == 3  # the worker's concurrency, all of it


def test_prefetch_does_not_hoard_past_a_share(jq):
    """In one process, so the worker's own holding can be read: with a fixed
    prefetch of 10 the worker would otherwise claim every slow job at once."""

    @jq.task(queue="slow")
    def slow() -> None:
        time.sleep(0.3)

    @jq.task(queue="fast")
    def fast() -> None:
        time.sleep(0.01)

    for _ in range(6):
        slow.enqueue()
    for _ in range(30):
        fast.enqueue()
    worker = jq.worker(queues={"slow": 2, "fast": None}, concurrency=4, prefetch=10)
    assert isinstance(worker, Worker)
    held_slow: list[int] = []
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while worker.stats.completed < 36 and time.monotonic() < deadline:
            jobs = worker.executor.running_jobs()  # running and ready
            held_slow.append(sum(1 for job in jobs if job.queue == "slow"))
            time.sleep(0.005)
        assert worker.stats.completed == 36
    finally:
        worker.stop()
        thread.join(60)
    assert max(held_slow) == 2


@pytest.mark.parametrize(
    ("queues", "concurrency", "message"),
    [
        (["emails=0"], 4, "--queue 'emails=0': the share must be between 1 and 10000, got 0"),
        (["emails=x"], 4, "--queue 'emails=x': the share after '=' must be a whole number"),
        (["emails="], 4, "--queue 'emails=': the share after '=' must be a whole number"),
        (["emails=-1"], 4, "--queue 'emails=-1': the share after '=' must be a whole number"),
        (["=5"], 4, "--queue '=5': queue name '' is invalid"),
        (["emails=5"], 4, "--queue 'emails=5': the share 5 is more than --concurrency 4"),
        (["emails=2", "emails=3"], 4, "queue 'emails' is given two shares: 2 and 3"),
    ],
)
def test_cli_refuses_a_bad_share_with_exit_2(tmp_path, capsys, queues, concurrency, message):
    argv = ["--database", f"sqlite:///{tmp_path / 'jobs.db'}", "worker", "--app", APP]
    argv += ["--concurrency", str(concurrency)]
    for queue in queues:
        argv += ["--queue", queue]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        (
            {"emails": 0},
            "queue 'emails': share must be an int between 1 and 10000 (or None), got 0",
        ),
        (
            {"emails": -3},
            "queue 'emails': share must be an int between 1 and 10000 (or None), got -3",
        ),
        ({"emails": True}, "queue 'emails': share must be an int between 1"),
        ({"emails": "5"}, "queue 'emails': share must be an int between 1"),
        ({"emails": 5}, "queue 'emails': its share 5 is more than the worker's concurrency 4"),
        (["emails=5"], "queue 'emails': its share 5 is more than the worker's concurrency 4"),
        (["emails=five"], "--queue 'emails=five': the share after '=' must be a whole number"),
    ],
)
def test_run_worker_refuses_a_bad_share(jq, queues, message):
    with pytest.raises(ConfigError) as info:
        jq.run_worker(queues=queues, concurrency=4)
    assert message in str(info.value)


def test_the_worker_refuses_a_share_of_a_queue_it_does_not_serve(jq):
    with pytest.raises(ConfigError, match=r"queue_shares\['other'\]: the worker does not serve"):
        Worker(
            jq.backend,
            jq.tasks,
            jq.settings,
            queues=["q"],
            concurrency=4,
            queue_shares={"other": 1},
        )
    with pytest.raises(ConfigError, match=r"queue_shares\['q'\]: a share must be an int between 1"):
        Worker(
            jq.backend, jq.tasks, jq.settings, queues=["q"], concurrency=4, queue_shares={"q": 5}
        )


def test_a_job_ending_at_its_queues_share_wakes_the_producer(make_queue):
    """Another queue keeps the worker's load up, so the refill rule alone
    would not ask for jobs when a slow job ends: the next one would wait for
    the poll (10 s here)."""
    jq = make_queue(poll_interval=10.0)
    long_done = threading.Event()

    @jq.task(queue="long")
    def long() -> None:
        long_done.wait(60)

    @jq.task(queue="slow")
    def slow() -> None:
        time.sleep(0.05)

    long.enqueue()
    for _ in range(5):
        slow.enqueue()
    worker = jq.worker(queues={"long": None, "slow": 1}, concurrency=4, prefetch=0)
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    thread.start()
    try:
        # Five slow jobs one after another: well under one poll interval.
        wait_for(lambda: worker.stats.completed >= 5, timeout=8.0, what="the five slow jobs")
    finally:
        long_done.set()
        worker.stop()
        thread.join(60)
