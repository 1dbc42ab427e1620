"""A worker keeps nothing of a finished job

Counts the live ``Job`` and ``_Execution`` objects after N and after 2N jobs
of every kind: what a finished job left behind grows with the second round,
what the worker needs does not. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import gc
import time

from jobkeeper import Retry, current_job
from jobkeeper.models import PENDING_STATUSES, Job
from jobkeeper.worker.slots import Execution as _Execution
from support.waiting import wait_for

from .helpers import running

#: Jobs of each kind per round.
ROUND = 1000
#: Running cancels are slower (each waits for a heartbeat): fewer of them.
CANCELS = 100
ARGS = {"blob": "x" * 2048}


def _live_objects() -> dict[str, int]:
    gc.collect()
    counts = {"Job": 0, "_Execution": 0}
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which a lazy
        # proxy in the same process answers by loading itself (Django's
        # unconfigured settings raised ImproperlyConfigured here).
        kind = type(obj)
        if issubclass(kind, Job):
            counts["Job"] += 1
        elif issubclass(kind, _Execution):
            counts["_Execution"] += 1
    return counts


def test_finished_jobs_of_every_kind_leave_nothing_behind(make_queue):
    jq = make_queue(heartbeat_interval=0.05, rescue_after=2.0)

    @jq.task(timeout=300)
    def with_timeout(blob: str) -> int:
        return len(blob)

    @jq.task(timeout=300)
    async def in_async(blob: str) -> int:
        await asyncio.sleep(0)
        return len(blob)

    @jq.task(max_attempts=1)
    def failing(blob: str) -> None:
        raise ValueError("fails")

    @jq.task(max_attempts=2, timeout=300)
    def retried(blob: str) -> str:
        if current_job().attempt == 1:
            raise Retry(delay=0)
        return "second time"

    @jq.task(timeout=300)
    def cancelled(blob: str) -> None:
        jq.cancel(current_job().id)
        for _ in range(600):  # interruptible: the cancel lands at once
            time.sleep(0.05)

    def one_round() -> None:
        specs = [
            (name, ARGS) for name in ("with_timeout", "in_async", "failing", "retried")
        ] * ROUND
        specs += [("cancelled", ARGS)] * CANCELS
        ids = [j.id for j in jq.enqueue_many(specs)]

        def settled() -> bool:
            stats = jq.stats().get("default", {})
            # Every unfinished state, "claimed" too: a worker's prefetched
            # jobs (up to 100 a slot on PostgreSQL) are Jobs it still holds.
            return not any(stats.get(s.value, 0) for s in PENDING_STATUSES)

        wait_for(settled, timeout=240, what=f"{len(ids)} jobs to settle")

    worker = jq.worker(concurrency=8)
    with running(worker):
        one_round()
        first = _live_objects()
        one_round()
        second = _live_objects()
    statuses = jq.stats()["default"]
    assert statuses.get("cancelled") == 2 * CANCELS, statuses
    assert statuses.get("dead") == 2 * ROUND, statuses
    # Growth over a round of 4,100 jobs: none is kept, so only noise.
    assert second["_Execution"] - first["_Execution"] <= 8, (first, second)
    assert second["Job"] - first["Job"] <= 8, (first, second)
    assert second["_Execution"] <= 8 + 8, second  # at most the slots (and a little slack)
