"""The crash budget in-process, with fabricated crashes (holders without a
worker row are silent at once): which rescues make a job a suspect, which
count as pinned crashes, when it is dead; and the slots' lone start.
"""

from __future__ import annotations

import threading

from jobkeeper import DatabaseUnavailable, JobStatus
from jobkeeper.maintenance.rescuer import Rescuer
from jobkeeper.models import Completion, Job
from jobkeeper.outcomes import claim_of, failed_attempt, released_attempt
from jobkeeper.worker.claims import Claims
from jobkeeper.worker.slots import Execution, Slots
from support.db import job
from support.waiting import wait_for

from .helpers import claimed_job, claims_of


def _claim(jq, holder: str) -> Job:
    """Claim the job once its retry (backoff up to FAST's 0.05 s) is due."""
    claimed: list[Job] = []

    def claim() -> bool:
        jq.backend.job_stage_due()
        claimed.extend(jq.backend.job_claim(worker_id=holder, queue="default", limit=1))
        return bool(claimed)

    wait_for(claim, what=f"a claim by {holder}")
    assert len(claimed) == 1
    return claimed[0]


def _start(jq, claimed: Job) -> None:
    """Start it as a new worker does: alone (with its fence) when a suspect."""
    if claimed.run_alone:
        assert jq.backend.job_start_alone(claim=claim_of(claimed))
    else:
        assert jq.backend.job_start_many(claims=[claim_of(claimed)]) == {claimed.id}


def _rescue(jq) -> None:
    rescuer = Rescuer(jq.backend, jq.settings, 0.1)
    rescuer.run_once()
    assert rescuer.rescued >= 1


def test_pinned_crashes_reach_the_dead_letters_with_attempts_left(make_queue):
    jq = make_queue(max_crashes=2)
    j = jq.enqueue("poison", {}, max_attempts=20)
    # Attempt 1 runs beside others (an ordinary start): lost, not a crash.
    first = _claim(jq, "w1:1:aaaa")
    assert not first.run_alone
    _start(jq, first)
    _rescue(jq)
    after = job(jq, j.id)
    assert after.run_alone and after.crashes == 0 and after.attempt == 1
    assert "not counted as a crash" in after.errors[-1]["error"]
    # Attempt 2, alone: pinned crash 1.
    second = _claim(jq, "w2:2:bbbb")
    assert second.run_alone
    _start(jq, second)
    _rescue(jq)
    after = job(jq, j.id)
    assert after.status == JobStatus.RETRYABLE and after.crashes == 1 and after.run_alone
    # Attempt 3, alone: pinned crash 2 = max_crashes: dead, 17 attempts left.
    third = _claim(jq, "w3:3:cccc")
    _start(jq, third)
    _rescue(jq)
    dead = jq.get_job(j.id)
    assert dead is not None and dead.status == JobStatus.DEAD
    assert dead.dead_reason is not None
    assert dead.dead_reason.startswith("crashed its worker 2 times (max_crashes=2)")
    assert "17 attempts were left" in dead.dead_reason
    assert dead.crashes == 2
    # A requeue starts the budget afresh.
    assert jq.requeue_dead([j.id]) == [j.id]
    again = job(jq, j.id)
    assert again.crashes == 0 and again.attempt == 0
    assert [e["attempt"] for e in dead.errors] == [1, 2, 3]


def test_a_suspect_run_beside_others_is_not_charged(make_queue):
    """An older worker (or a failed lone start mark) runs a suspect with an
    ordinary start: its crash costs the attempt and is never counted.
    """
    jq = make_queue(max_crashes=1)
    j = jq.enqueue("some_task", {}, max_attempts=20)
    _start(jq, _claim(jq, "w1:1:aaaa"))
    _rescue(jq)
    for n in range(2, 5):
        suspect = _claim(jq, f"old{n}:{n}:dddd")
        assert suspect.run_alone
        assert jq.backend.job_start_many(claims=[claim_of(suspect)]) == {suspect.id}
        _rescue(jq)
        after = job(jq, j.id)
        assert after.status == JobStatus.RETRYABLE and after.crashes == 0 and after.attempt == n


def test_a_lone_attempt_that_ends_normally_clears_the_suspicion(make_queue):
    jq = make_queue()
    j = jq.enqueue("some_task", {}, max_attempts=20)
    _start(jq, _claim(jq, "w1:1:aaaa"))
    _rescue(jq)
    lone = _claim(jq, "w2:2:bbbb")
    _start(jq, lone)
    # It raised: a failed attempt the worker wrote (it did not crash).
    failure = failed_attempt(lone, jq.settings, error="ValueError: no", retry_in=0)
    assert jq.backend.job_fail_many(failures=[failure]) == {j.id}
    after = job(jq, j.id)
    assert not after.run_alone and after.crashes == 0
    # A hand-back of a suspect keeps it a suspect.
    _start(jq, _claim(jq, "w3:3:cccc"))
    _rescue(jq)
    waiting = _claim(jq, "w4:4:dddd")
    assert waiting.run_alone
    released = released_attempt(waiting, None)
    assert jq.backend.job_fail_many(failures=[released]) == {j.id}
    assert job(jq, j.id).run_alone


def test_a_lone_attempt_that_completes_clears_the_suspicion(make_queue, db_url):
    # helper-81: completed jobs kept run_alone; a retry of one ran alone again.
    import contextlib
    import sqlite3

    import psycopg

    jq = make_queue()
    batched = jq.enqueue("some_task", {}, max_attempts=20)
    in_tx = jq.enqueue("some_task", {}, max_attempts=20)
    for n in range(2):
        _start(jq, _claim(jq, f"w{n}:{n}:aaaa"))
        _rescue(jq)
    lone = [_claim(jq, "w7:7:bbbb") for _ in range(2)]
    for claimed in lone:
        assert claimed.run_alone
        _start(jq, claimed)
    first, second = sorted(lone, key=lambda j: j.id)
    done = Completion(claim_of(first), "1")
    assert jq.backend.job_complete_many(completions=[done], delete=False) == {batched.id}
    connect = psycopg.connect if db_url.startswith("postgres") else sqlite3.connect
    target = jq.url.url if db_url.startswith("postgres") else jq.url.path
    with contextlib.closing(connect(target)) as conn:
        completion = Completion(claim_of(second), "2")
        assert jq.backend.job_complete_in(connection=conn, completion=completion, delete=False)
        conn.commit()
    for j in (batched, in_tx):
        after = job(jq, j.id)
        assert after.status == JobStatus.COMPLETED and not after.run_alone


def _job(job_id: int, *, run_alone: bool = False) -> Job:
    return claimed_job(job_id, run_alone=run_alone)


def test_slots_start_a_suspect_only_alone_and_hand_back_other_suspects():
    started: list[Execution] = []
    release = {i: threading.Event() for i in range(1, 6)}
    slots: Slots

    def work(execution: Execution) -> None:
        started.append(execution)
        release[execution.job.id].wait(30)
        deliver, wake = slots.ended(execution)
        if deliver:
            slots.delivered(execution, wake)
            slots.settled([(execution.job.id, execution.job.fence)])  # written at once

    slots = Slots(
        concurrency=3, refill_at=1, on_need_jobs=lambda: None, timeout_of=lambda j: None, work=work
    )
    # Ordinary 1, 2 and 5 start at once (ordinary jobs go first); the
    # suspects 3 and 4 wait for nothing else to run.
    slots.offer([_job(1), _job(2), _job(3, run_alone=True), _job(4, run_alone=True), _job(5)])
    wait_for(lambda: len(started) == 3, what="the three ordinary jobs to start")
    assert sorted(e.job.id for e in started) == [1, 2, 5]
    assert slots.snapshot().alone == 2
    for i in (1, 2):
        release[i].set()
    wait_for(lambda: slots.snapshot().running == 1, what="two to end")
    assert len(started) == 3  # 5 still runs: no suspect starts beside it
    release[5].set()
    wait_for(lambda: len(started) == 4, what="a suspect to start alone")
    lone = started[3]
    assert lone.job.id == 3 and lone.alone
    # The other suspect is handed to the lone execution, to be given back.
    assert [j.id for j in lone.beside] == [4]
    assert slots.snapshot().ready == 0 and slots.snapshot().alone == 1
    # Offered while it runs: waits until it ends.
    slots.offer([_job(6)])
    release[6] = threading.Event()
    assert slots.snapshot().running == 1
    release[3].set()
    wait_for(lambda: len(started) == 5, what="the ordinary job after the lone one")
    assert started[4].job.id == 6 and not started[4].alone
    release[6].set()
    slots.close()


def test_a_suspect_starts_only_once_every_outcome_before_it_is_written_and_so_does_the_next():
    # helper-81: the lone suspect started 2 ms after the job before it had
    # returned, its outcome still in the completer's buffer; the suspect
    # killed the worker, and the rescue pinned the crash on that finished
    # job, found running with its lone fence (and dead-lettered it).
    started: list[Execution] = []
    release = {i: threading.Event() for i in range(1, 4)}
    ended: list[Execution] = []
    slots: Slots

    def work(execution: Execution) -> None:
        started.append(execution)
        release[execution.job.id].wait(30)
        deliver, wake = slots.ended(execution)
        assert deliver
        slots.delivered(execution, wake)
        ended.append(execution)  # handed to the completer, not written yet

    def key(execution: Execution) -> tuple[int, int]:
        return (execution.job.id, execution.job.fence)

    slots = Slots(
        concurrency=2, refill_at=0, on_need_jobs=lambda: None, timeout_of=lambda j: None, work=work
    )
    slots.offer([_job(1), _job(2, run_alone=True)])
    wait_for(lambda: len(started) == 1, what="the ordinary job to start")
    release[1].set()
    wait_for(lambda: len(ended) == 1, what="it to end")
    assert len(started) == 1 and slots.snapshot().alone == 1  # its outcome is unwritten
    slots.settled([(99, 0)])  # another job's: still not
    assert len(started) == 1
    slots.settled([key(ended[0])])
    wait_for(lambda: len(started) == 2, what="the suspect to start alone")
    assert started[1].job.id == 2 and started[1].alone
    slots.offer([_job(3)])
    release[2].set()
    wait_for(lambda: len(ended) == 2, what="the lone attempt to end")
    assert len(started) == 2  # nothing starts until the lone outcome is written
    assert slots.snapshot().alone == 1
    slots.settled([key(ended[1])])
    wait_for(lambda: len(started) == 3, what="the next job after the lone outcome")
    assert started[2].job.id == 3 and slots.snapshot().alone == 0
    release[3].set()
    slots.close()


class _StartAloneFails:
    """The queue's backend, but the first ``failures`` lone start marks
    raise (a database outage as the suspect is about to start).
    """

    def __init__(self, backend, failures: int) -> None:
        self._backend = backend
        self.failures = failures
        self.calls = 0

    def job_start_alone(self, *, claim):
        self.calls += 1
        if self.calls <= self.failures:
            raise DatabaseUnavailable("the database went away (test)")
        return self._backend.job_start_alone(claim=claim)


class _FreshHeartbeat:
    def liveness(self) -> tuple[float, int]:
        return 0.0, 0


class _NoBatchedMarks:
    def add(self, item) -> None:
        raise AssertionError(f"a lone start mark must not be batched: {item}")


def _claims(backend, worker_id: str) -> Claims:
    return claims_of(backend, worker_id, _FreshHeartbeat(), _NoBatchedMarks())


def test_a_suspect_starts_only_once_its_lone_start_mark_is_written(make_queue):
    # Unwritten (the database down for a moment), a crash of the lone
    # attempt was only a lost attempt: a poison job took down more workers
    # than max_crashes allows (seen in the PostgreSQL soak, with restarts).
    jq = make_queue(max_crashes=2)
    j = jq.enqueue("poison", {}, max_attempts=20)
    _start(jq, _claim(jq, "w1:1:aaaa"))
    _rescue(jq)
    suspect = _claim(jq, "w2:2:bbbb")
    assert suspect.run_alone
    flaky = _StartAloneFails(jq.backend, failures=2)
    claims = _claims(flaky, "w2:2:bbbb")
    claims.claimed([suspect], claims.stamp())
    assert claims.may_start(suspect)
    assert flaky.calls == 3
    marked = job(jq, j.id)
    assert marked.status == JobStatus.RUNNING and marked.attempt == 2
    claims.started(suspect)  # written already: nothing batched, no second write
    assert flaky.calls == 3
    # Its crash now is pinned on it.
    _rescue(jq)
    assert job(jq, j.id).crashes == 1


def test_a_suspect_whose_claim_was_lost_does_not_start(make_queue):
    jq = make_queue(max_crashes=2)
    j = jq.enqueue("poison", {}, max_attempts=20)
    _start(jq, _claim(jq, "w1:1:aaaa"))
    _rescue(jq)
    suspect = _claim(jq, "w2:2:bbbb")
    # Given back free (its holder silent, the job never started), then
    # claimed by another worker: the first holder's fenced mark matches nothing.
    _rescue(jq)
    _claim(jq, "w3:3:cccc")
    claims = _claims(_StartAloneFails(jq.backend, failures=0), "w2:2:bbbb")
    claims.claimed([suspect], claims.stamp())
    assert not claims.may_start(suspect)
    assert job(jq, j.id).worker_id == "w3:3:cccc"
