"""Waiting, async enqueue and periodic accuracy (issue 14). Prints figures;
never asserted.

    .venv/bin/python benchmarks/results.py --backend all --jobs 200 --ticks 8

* wait: a job's ``finished_at`` (database clock, same host) to its waiter
  returning, p50/p99, sync (one thread per waiter) and async (one loop);
* enqueue: jobs/s of sequential sync ``enqueue``, sequential
  ``await enqueue_async``, and 50 ``enqueue_async`` in flight;
* periodic: ``jq.periodic(every=1)`` with one worker, tick instant to the
  task's start, p50/p99/max.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from jobkeeper import JobQueue, current_job
from worker.helpers import running

PG = "postgresql://postgres@127.0.0.1:5432/test"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def fmt(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"p50 {pct(ms, 50):7.2f} ms  p99 {pct(ms, 99):7.2f} ms  (n={len(ms)})"


def new_queue(backend: str, tmp: str) -> JobQueue:
    if backend == "sqlite":
        url = f"sqlite:///{tmp}/bench-{uuid.uuid4().hex[:6]}.db"
    else:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        url = f"{PG}?options=-csearch_path%3D{schema}"
    jq = JobQueue(url, poll_interval=0.05)
    jq.migrate()
    return jq


def bench_wait(backend: str, tmp: str, n: int) -> None:
    jq = new_queue(backend, tmp)
    gate = threading.Event()

    @jq.task()
    def gated(i: int) -> int:
        gate.wait(60)
        time.sleep(0.002 * (i % 20))  # spread the completions out
        return i

    for mode in ("sync", "async"):
        gate.clear()
        jobs = jq.enqueue_many([("gated", {"i": i}) for i in range(n)])
        returned: dict[int, float] = {}

        def one(job_id: int) -> None:
            jq.wait(job_id, timeout=120)
            returned[job_id] = time.time()  # noqa: B023 - joined within the round

        async def all_async() -> None:
            async def one_async(job_id: int) -> None:
                await jq.wait_async(job_id, timeout=120)
                returned[job_id] = time.time()  # noqa: B023 - joined within the round

            await asyncio.gather(*(one_async(j.id) for j in jobs))  # noqa: B023
            await jq.aclose()

        if mode == "sync":
            threads = [threading.Thread(target=one, args=(j.id,)) for j in jobs]
        else:
            threads = [threading.Thread(target=lambda: asyncio.run(all_async()))]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # waiters in place
        with running(jq.worker(concurrency=20)):
            gate.set()
            for thread in threads:
                thread.join(120)
        lags = []
        for job in jobs:
            finished = jq.get_job(job.id)
            assert finished is not None and finished.finished_at is not None
            lags.append(returned[job.id] - finished.finished_at.timestamp())
        print(f"  wait {mode:5}  completion -> waiter returns: {fmt(lags)}")
    jq.close()


def bench_enqueue(backend: str, tmp: str, n: int) -> None:
    jq = new_queue(backend, tmp)

    @jq.task()
    def noop(i: int) -> None: ...

    started = time.perf_counter()
    for i in range(n):
        noop.enqueue(i=i)
    sync_rate = n / (time.perf_counter() - started)

    async def sequential() -> float:
        started = time.perf_counter()
        for i in range(n):
            await noop.enqueue_async(i=i)
        return n / (time.perf_counter() - started)

    async def concurrent() -> float:
        semaphore = asyncio.Semaphore(50)

        async def one(i: int) -> None:
            async with semaphore:
                await noop.enqueue_async(i=i)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        rate = n / (time.perf_counter() - started)
        await jq.aclose()
        return rate

    async def both() -> tuple[float, float]:
        return await sequential(), await concurrent()

    seq_rate, conc_rate = asyncio.run(both())
    print(
        f"  enqueue  sync {sync_rate:7.0f}/s   async sequential {seq_rate:7.0f}/s   "
        f"async 50 in flight {conc_rate:7.0f}/s  (n={n})"
    )
    jq.close()


def bench_periodic(backend: str, tmp: str, ticks: int) -> None:
    jq = new_queue(backend, tmp)
    lags: list[float] = []

    @jq.periodic(every=1)
    @jq.task()
    def tick() -> None:
        lags.append(time.time() - current_job().scheduled_at.timestamp())

    with running(jq.worker(concurrency=2)):
        deadline = time.monotonic() + ticks + 15
        while len(lags) < ticks and time.monotonic() < deadline:
            time.sleep(0.1)
    print(f"  periodic every=1  tick -> start: {fmt(lags)}  max {max(lags) * 1000:.1f} ms")
    jq.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["postgres", "sqlite", "all"], default="all")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--enqueues", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=8)
    args = parser.parse_args()
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            print(backend)
            bench_wait(backend, tmp, args.jobs)
            bench_enqueue(backend, tmp, args.enqueues)
            bench_periodic(backend, tmp, args.ticks)


if __name__ == "__main__":
    main()
