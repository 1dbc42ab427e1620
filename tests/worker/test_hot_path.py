"""What a busy worker does per job, and what it no longer does (speed round
two): runner threads and the producer share the slots' lock and the GIL, so
each lock, wake-up and system call per job is paid by all of them. Each test
pins one cut and the guarantee beside it. Backend-free: these are the
executor's own structures.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from jobkeeper.config import Settings
from jobkeeper.models import Job
from jobkeeper.worker import producer as producer_module
from jobkeeper.worker import verdicts
from jobkeeper.worker.slots import Execution, Slots
from support.waiting import wait_for

from .helpers import claimed_job


def _job(job_id: int) -> Job:
    return claimed_job(job_id, attempted_at=datetime.now(UTC), fence=1)


class _CountingLock:
    """A lock that counts its acquisitions."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.acquired = 0

    def __enter__(self) -> bool:
        self.acquired += 1
        return bool(self._lock.__enter__())

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(*exc)


def test_a_delivery_takes_the_slots_lock_only_for_the_last_one() -> None:
    """``Slots.delivered`` ran under the slots' lock once a job; it now takes
    it only when nothing else is running or delivering (to wake
    ``wait_idle``), and ``wait_idle`` still returns once the last is in.
    """
    go = {1: threading.Event(), 2: threading.Event()}
    counts: dict[int, int] = {}

    def work(execution: Execution) -> None:
        job_id = execution.job.id
        go[job_id].wait(10)
        _, wake = slots.ended(execution)
        before = counting.acquired
        slots.delivered(execution, wake)
        counts[job_id] = counting.acquired - before

    slots = Slots(
        concurrency=2, refill_at=0, on_need_jobs=lambda: None, timeout_of=lambda j: None, work=work
    )
    counting = _CountingLock(slots._lock)
    slots._lock = counting  # type: ignore[assignment]
    slots.offer([_job(1), _job(2)])
    wait_for(lambda: slots.snapshot().running == 2, what="both jobs to start")
    go[1].set()
    wait_for(lambda: 1 in counts, what="the first delivery")
    assert counts[1] == 0  # job 2 still runs: no lock
    assert not slots.wait_idle(0.05)
    go[2].set()
    assert slots.wait_idle(10)  # the last delivery woke it
    assert counts[2] == 1
    slots.close()


def test_an_offer_wakes_one_runner_which_passes_the_wake_up_on() -> None:
    """The producer's offer woke every waiting runner itself (one system call
    each, on the claim's critical path); it now wakes one, and each runner
    that takes a job wakes the next while jobs are ready: all of a batch
    still start at once when the slots are free.
    """
    concurrency = 4
    barrier = threading.Barrier(concurrency)
    phase: dict[str, bool] = {"blocking": False}

    def work(execution: Execution) -> None:
        if phase["blocking"]:
            barrier.wait(10)  # only if all four run at once
        deliver, wake = slots.ended(execution)
        if deliver:
            slots.delivered(execution, wake)

    slots = Slots(
        concurrency=concurrency,
        refill_at=0,
        on_need_jobs=lambda: None,
        timeout_of=lambda j: None,
        work=work,
    )
    slots.offer([_job(i) for i in range(1, concurrency + 1)])  # start the runners
    assert slots.wait_idle(10)
    wait_for(lambda: slots._waiting == concurrency, what="the runners to wait for work")
    notified: list[tuple[Any, ...]] = []
    notify = slots._changed.notify

    def recording_notify(*args: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            notified.append(args)
        notify(*args)

    slots._changed.notify = recording_notify  # type: ignore[method-assign]
    phase["blocking"] = True
    slots.offer([_job(i) for i in range(11, 11 + concurrency)])
    assert notified == [()]  # one runner, woken by the offer
    assert slots.wait_idle(15), "the batch did not run at once"
    assert not barrier.broken
    slots.close()


def test_the_verdict_reads_no_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether an attempt ends in a child the task forked was asked of
    ``os.getpid()`` once an attempt (a system call); a count of forks kept
    by ``os.register_at_fork`` answers it now. tests/api/test_fork.py runs
    the forked children themselves.
    """
    judge = verdicts.Verdicts(Settings(), {})
    execution = Execution(_job(1), None)

    def no_getpid() -> int:
        raise AssertionError("os.getpid() called for a verdict")

    monkeypatch.setattr(os, "getpid", no_getpid)
    outcome = judge.ended(execution, result=None)
    assert outcome.claim.job_id == 1 and outcome.claim.fence == 1


def test_a_pending_wake_up_is_not_set_again() -> None:
    """Runner threads wake the producer as jobs end; with a wake-up already
    pending, ``Event.set()`` (its lock, its notify) is not called again.
    """
    producer = producer_module.Producer.__new__(producer_module.Producer)
    sets: list[int] = []

    class CountingEvent(threading.Event):
        def set(self) -> None:
            sets.append(1)
            super().set()

    producer._wake = CountingEvent()
    producer.wake()
    producer.wake()
    producer.wake()
    assert len(sets) == 1 and producer._wake.is_set()
    producer._wake.clear()  # the loop takes it
    producer.wake()
    assert len(sets) == 2
