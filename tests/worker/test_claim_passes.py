"""When the producer claims again: a claim that comes back short took all
there was, so the producer waits for a wake-up instead of claiming again at
once (a full one may have left more: see ``Producer.run``).
"""

from __future__ import annotations

import threading
from typing import Any

from support.waiting import DEADLINE

from .helpers import running


def _log_claims_and_waits(worker: Any) -> list[Any]:
    """The producer's claims (jobs taken) and waits, in order."""
    log: list[Any] = []
    producer = worker.producer
    job_claim = producer._backend.job_claim
    wake_wait = producer._wake.wait

    def claim(**kwargs: Any) -> Any:
        jobs = job_claim(**kwargs)
        log.append(len(jobs))
        return jobs

    def wait(timeout: float | None = None) -> bool:
        log.append("wait")
        return bool(wake_wait(timeout))

    producer._backend.job_claim = claim
    producer._wake.wait = wait
    return log


def test_a_short_claim_is_not_followed_by_another_at_once(make_queue):
    jq = make_queue(poll_interval=3600.0)
    started, release = threading.Event(), threading.Event()

    @jq.task()
    def hold() -> None:
        started.set()
        release.wait(DEADLINE)

    jq.enqueue("hold", {})
    worker = jq.worker(concurrency=2)
    log = _log_claims_and_waits(worker)
    with running(worker):
        assert started.wait(DEADLINE)
        release.set()
    took = log.index(1)
    assert log[took + 1] == "wait", log
