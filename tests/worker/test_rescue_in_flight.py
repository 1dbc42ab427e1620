"""A holder confirming its claims while a rescue of them is in flight.

After a stale spell (its process was paused, say) a worker starts a job it
claimed before the spell only once the database confirms, as of a fresh
heartbeat, that it still holds it (``Claims.may_start``). A rescuer whose
snapshot was taken just before that heartbeat committed judged the holder
silent, and while its return of the job was written but not yet committed,
the job still looked held: the holder started it, the return committed, and
another worker ran the same attempt beside it. The PostgreSQL chaos soak
failed once that way ("attempt 1 on two live workers, never rescued": the
audit had the holder's heartbeat, begun before the rescue's transaction and
committed after its snapshot).

These tests hold a rescue at the point in its transaction where that
happened and let the holder beat and confirm meanwhile: whoever wins, the
job is never both confirmed to the holder and returned by the rescue.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobkeeper import Job, JobQueue, JobStatus
from jobkeeper.backends.postgres.queries import QUERIES as PG_QUERIES
from jobkeeper.outcomes import returned_attempt
from support.db import is_pg, job
from support.settings import FAST
from support.waiting import wait_for

from .helpers import age_heartbeat, claims_of, holder_info

HOLDER = "holder:1:f00d"
RESCUER_THREAD = "test-rescuer"


def _silent_holder_with_a_claim(jq: JobQueue) -> Job:
    """A claimed, unstarted job whose holder has been silent for an hour."""
    jq.backend.worker_register(worker=holder_info(HOLDER))
    jq.enqueue("some_task", {})
    (claimed,) = jq.backend.job_claim(worker_id=HOLDER, queue="default", limit=1)
    age_heartbeat(jq, HOLDER, 3600)
    (candidate,) = jq.backend.job_rescue_candidates(rescue_after=jq.settings.rescue_after, limit=9)
    assert candidate.id == claimed.id
    return candidate


class _Gate:
    """Where the rescue thread stops, until :meth:`open`."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._open = threading.Event()

    def stop_here(self) -> None:
        if threading.current_thread().name == RESCUER_THREAD:
            self.reached.set()
            assert self._open.wait(30), "the test never let the rescue go on"

    def open(self) -> None:
        self._open.set()


def _hold_before_commit(jq: JobQueue, gate: _Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop the rescue's transaction after its writes, before its commit."""
    backend = jq.backend
    name = "_cursor" if is_pg(jq) else "_write"
    original: Callable[..., Any] = getattr(backend, name)

    @contextlib.contextmanager
    def held(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with original(*args, **kwargs) as handle:
            yield handle
            gate.stop_here()

    monkeypatch.setattr(backend, name, held)


def _rescue_in_thread(jq: JobQueue, candidate: Job) -> tuple[threading.Thread, list[set[int]]]:
    written: list[set[int]] = []

    def rescue() -> None:
        written.append(
            jq.backend.job_fail_many(
                failures=[returned_attempt(candidate)], stale_after=jq.settings.rescue_after
            )
        )

    thread = threading.Thread(target=rescue, name=RESCUER_THREAD, daemon=True)
    thread.start()
    return thread, written


class _FreshHeartbeat:
    """The holder's heartbeat just after its stale spell: fresh, one spell
    counted since the job was claimed.
    """

    def liveness(self) -> tuple[float, int]:
        return 0.0, 1


def _beat_and_confirm_in_thread(jq: JobQueue, job_: Job) -> tuple[threading.Thread, list[bool]]:
    """The holder back from its spell: a fresh beat, then the worker's check
    before it starts the job claimed before the spell.
    """
    claims = claims_of(
        jq.backend, HOLDER, _FreshHeartbeat(), fresh_for=jq.settings.rescue_after / 2
    )
    claims.claimed([job_], stamp=0)
    may_start: list[bool] = []

    def confirm() -> None:
        jq.backend.worker_heartbeat(worker=holder_info(HOLDER))
        may_start.append(claims.may_start(job_))

    thread = threading.Thread(target=confirm, name="test-holder", daemon=True)
    thread.start()
    return thread, may_start


def _waits_on_a_row_lock(jq: JobQueue) -> bool:
    with psycopg.connect(jq.url.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


def test_a_rescue_written_but_not_committed_is_seen_by_the_holders_confirmation(
    jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    candidate = _silent_holder_with_a_claim(jq)
    gate = _Gate()
    _hold_before_commit(jq, gate, monkeypatch)
    rescuer, written = _rescue_in_thread(jq, candidate)
    try:
        assert gate.reached.wait(30)
        holder, may_start = _beat_and_confirm_in_thread(jq, candidate)
        if is_pg(jq):
            # The confirmation either answers (the defect: the job looks
            # held) or waits on the rescue's row lock.
            wait_for(lambda: may_start or _waits_on_a_row_lock(jq), what="the confirmation")
        else:
            # SQLite: the beat waits for the rescue's write lock, whatever
            # the moment it is let go.
            holder.join(0.2)
    finally:
        gate.open()
    rescuer.join(30)
    holder.join(30)
    assert not rescuer.is_alive() and not holder.is_alive()
    # Judged silent before the beat, the rescue returns the job; the holder
    # must then not start it.
    assert written == [{candidate.id}]
    assert may_start == [False]
    returned = job(jq, candidate.id)
    assert (returned.status, returned.worker_id, returned.attempt) == (
        JobStatus.AVAILABLE,
        None,
        0,
    )


@pytest.fixture
def pg_jq(pg_url: str) -> Iterator[JobQueue]:
    jq = JobQueue(pg_url, **FAST)
    jq.migrate()
    yield jq
    jq.close()


def test_a_rescue_judges_the_holder_only_once_it_holds_the_rows(
    pg_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL only (SQLite judges and writes under its one write lock,
    which the holder's beat waits for): the rescue locks its rows, then
    judges by a later snapshot; a holder that beat and confirmed in between
    keeps its job.
    """
    jq = pg_jq
    candidate = _silent_holder_with_a_claim(jq)
    gate = _Gate()
    execute = psycopg.Cursor.execute

    def execute_then_stop(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        result = execute(self, query, *args, **kwargs)
        if query == PG_QUERIES["job_fail_many_lock"]:
            gate.stop_here()
        return result

    monkeypatch.setattr(psycopg.Cursor, "execute", execute_then_stop)
    rescuer, written = _rescue_in_thread(jq, candidate)
    try:
        assert gate.reached.wait(30)
        holder, may_start = _beat_and_confirm_in_thread(jq, candidate)
        wait_for(lambda: _waits_on_a_row_lock(jq), what="the confirmation waiting on the rescue")
    finally:
        gate.open()
    rescuer.join(30)
    holder.join(30)
    assert written == [set()]
    assert may_start == [True]
    kept = job(jq, candidate.id)
    assert (kept.status, kept.worker_id) == (JobStatus.CLAIMED, HOLDER)
