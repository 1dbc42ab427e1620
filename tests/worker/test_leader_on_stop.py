"""A stopping worker gives the maintenance lease up as its stop begins (not
after its grace period) and never takes it on the way out.
"""

from __future__ import annotations

import threading

from jobkeeper import JobQueue
from jobkeeper.maintenance.leader import MAINTENANCE
from support.waiting import DEADLINE, wait_for

from .helpers import running


def test_a_stopping_worker_resigns_the_lease_while_its_jobs_finish(make_queue) -> None:
    # A grace longer than any wait here: the lease must be free within it.
    jq: JobQueue = make_queue(shutdown_grace=10 * DEADLINE)
    release = threading.Event()
    started = threading.Event()
    ended = threading.Event()

    @jq.task()
    def slow() -> None:
        started.set()
        try:
            release.wait(DEADLINE)
        finally:
            ended.set()

    jq.enqueue(slow)
    worker = jq.worker(concurrency=1)
    with running(worker) as handle:
        wait_for(lambda: jq.backend.leader_get(name=MAINTENANCE) == worker.info.id, what="lead")
        assert started.wait(DEADLINE)
        worker.stop()
        # The lease is free while the job still runs in the grace period.
        wait_for(lambda: jq.backend.leader_get(name=MAINTENANCE) is None, what="resigned")
        assert not ended.is_set()
        assert handle.thread.is_alive()
        assert not worker.leader.is_leader
        assert jq.backend.leader_try_acquire(name=MAINTENANCE, worker_id="other", ttl=60)
        release.set()
    assert jq.backend.leader_get(name=MAINTENANCE) == "other"
