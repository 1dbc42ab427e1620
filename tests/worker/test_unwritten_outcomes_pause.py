"""A worker whose outcomes cannot be written stops claiming until they are.

A break-test (PostgreSQL's data directory on a full tmpfs) found workers
claiming and running job after job whose outcomes they could not record:
the claim and heartbeat updates fit in existing pages, the outcome writes
did not. 135 outcomes piled up in memory; a worker SIGKILLed meanwhile had
all 9 jobs it ran to success run again, and one that ran and failed was
returned as "had not started". Here the worker's outcome writes fail (a
backend wrapper on both backends, a trigger on PostgreSQL) while its claims
and heartbeats succeed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from jobkeeper import JobQueue, JobStatus
from jobkeeper.errors import DatabaseUnavailable
from jobkeeper.worker import claim_hold
from jobkeeper.worker.claim_hold import ClaimHold
from support.db import sql
from support.settings import FAST
from support.waiting import wait_for

from .helpers import running

JOBS = 20
#: Seconds of failing writes that pause claims, in these tests (1 s in use).
STALLED_AFTER = 0.2
DISK_FULL = 'could not extend file "base/16384/16390": No space left on device'


class _OutcomesFail:
    """The worker's outcomes backend, whose outcome and start-mark writes
    fail while ``failing`` is set (everything else passes through).
    """

    def __init__(self, backend: Any, failing: threading.Event) -> None:
        self._backend = backend
        self._failing = failing
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def _check(self) -> None:
        if self._failing.is_set():
            self.failed += 1
            raise DatabaseUnavailable(f"injected: {DISK_FULL}")

    def job_start_many(self, **kwargs: Any) -> Any:
        self._check()
        return self._backend.job_start_many(**kwargs)

    def job_complete_many(self, **kwargs: Any) -> Any:
        self._check()
        return self._backend.job_complete_many(**kwargs)

    def job_fail_many(self, **kwargs: Any) -> Any:
        self._check()
        return self._backend.job_fail_many(**kwargs)


def _claimed(jq: JobQueue) -> int:
    query = "SELECT count(*) FROM jobkeeper_jobs WHERE status <> 'available'"
    return int(sql(jq, query)[0][0])


def _run_through_an_outage(
    jq: JobQueue, caplog: pytest.LogCaptureFixture, failing: threading.Event
) -> None:
    """Enqueue ``JOBS`` jobs, run a worker (concurrency 2) while ``failing``
    says its outcome writes fail, and check that it stops claiming, holds,
    then claims again and completes every job exactly once.
    """
    runs: Counter[int] = Counter()

    @jq.task()
    def job(n: int) -> None:
        runs[n] += 1
        time.sleep(0.05)  # 20 jobs, 2 at a time: 0.5 s, past STALLED_AFTER

    jobs = jq.enqueue_many([("job", {"n": n}) for n in range(JOBS)])
    caplog.set_level(logging.INFO, logger="jobkeeper.worker")
    failing.set()
    worker = jq.worker(concurrency=2, prefetch=0)
    with running(worker):
        wait_for(
            lambda: "not claiming until they are" in caplog.text,
            what="the worker pausing its claims",
        )
        held = _claimed(jq)
        assert worker.completer.pending > 0
        # Claims stay paused while the writes fail: over ten polls and as
        # many heartbeats, not one more job is claimed.
        time.sleep(10 * jq.settings.poll_interval + 0.2)
        assert _claimed(jq) == held
        assert held < JOBS, "every job was claimed before claims paused"
        assert caplog.text.count("not claiming until they are") == 1
        assert "claiming again" not in caplog.text
        failing.clear()
        wait_for(
            lambda: all(jq.get_job(j.id).status == JobStatus.COMPLETED for j in jobs),
            what="every job completed once the outcomes are written",
        )
    assert caplog.text.count("outcomes written again; claiming again") == 1
    assert runs == Counter(range(JOBS)), runs


@pytest.fixture(autouse=True)
def _stalled_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claim_hold, "WRITES_STALLED_AFTER", STALLED_AFTER)


def test_a_worker_stops_claiming_while_its_outcomes_cannot_be_written(
    jq: JobQueue, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = threading.Event()
    wrapped: list[_OutcomesFail] = []
    dedicated = jq.backend.dedicated

    def dedicated_failing(role: str = "", **options: Any) -> Any:
        backend = dedicated(role, **options)
        if role.startswith("outcomes "):
            wrapped.append(_OutcomesFail(backend, failing))
            return wrapped[-1]
        return backend

    monkeypatch.setattr(jq.backend, "dedicated", dedicated_failing)
    _run_through_an_outage(jq, caplog, failing)
    assert wrapped and wrapped[0].failed > 0


_TRIGGER = """
CREATE TABLE write_outage (on_ boolean NOT NULL);
INSERT INTO write_outage VALUES (false);
CREATE FUNCTION write_outage_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT on_ FROM write_outage) THEN
        RAISE EXCEPTION 'could not extend file "base/16384/16390": No space left on device'
            USING ERRCODE = 'disk_full';
    END IF;
    RETURN NEW;
END $$;
-- The outcome write (job_complete_many) sets status 'completed'.
CREATE TRIGGER write_outage BEFORE UPDATE ON jobkeeper_jobs FOR EACH ROW
    WHEN (NEW.status = 'completed' AND OLD.status <> 'completed')
    EXECUTE FUNCTION write_outage_check();
"""


def test_a_pg_worker_whose_completions_fail_in_the_database_stops_claiming(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # End to end on PostgreSQL: no wrapper, the server refuses the outcome
    # writes (SQLSTATE 53100, disk_full, as a full disk does) while claims,
    # start marks and heartbeats go through.
    jq = JobQueue(pg_url, **FAST)
    try:
        jq.migrate()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(_TRIGGER)

        class _Flag:
            def set(self) -> None:
                sql(jq, "UPDATE write_outage SET on_ = true")

            def clear(self) -> None:
                sql(jq, "UPDATE write_outage SET on_ = false")

        _run_through_an_outage(jq, caplog, _Flag())  # type: ignore[arg-type]
        assert "No space left on device" in caplog.text
    finally:
        jq.close()


def test_writes_failing_for_less_than_the_bound_do_not_pause_claims() -> None:
    # A blip (one failed flush, retried 50 ms later) must not pause claims.
    class _Fresh:
        def fresh(self) -> bool:
            return True

    class _Completer:
        failing_since: float | None = None
        pending = 3

    completer = _Completer()
    hold = ClaimHold(_Fresh(), completer)  # type: ignore[arg-type]
    assert not hold.holding()
    completer.failing_since = time.monotonic()
    assert not hold.holding()
    completer.failing_since = time.monotonic() - STALLED_AFTER
    assert hold.holding() and hold.reason == "writes"
    completer.failing_since = None
    assert not hold.holding() and not hold.paused
