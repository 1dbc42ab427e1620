"""A job's fence never goes back (schema version 18): a dead letter keeps
it, and every way back to pending (``requeue_dead`` of some or all, a retry
of the dead job, one of any other status) goes on from it, on both backends.
A requeue wrote the job back at fence 0, so a holder stale from before it,
once its own worker claimed the job again at the same attempt, held the new
claim's very (id, worker_id, attempt, fence): its complete_in and outcome
writes went through while the new attempt ran.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psycopg
import pytest

from jobkeeper import JobQueue, JobStatus
from jobkeeper.models import Claim, Completion
from support.db import is_pg, job, migrate_to, sql

from .helpers import WORKER, claim, claim_of, complete, fail


def _die(jq: JobQueue, job_id: int, worker_id: str = WORKER) -> Claim:
    """Claim ``job_id`` (the only available job) as ``worker_id``, start it
    and dead-letter it with its own claim (as the rescuer does for a silent
    holder); return that claim."""
    (held,) = claim(jq, worker_id=worker_id)
    assert held.id == job_id
    stale = claim_of(held)
    assert jq.backend.job_start_many(claims=[stale]) == {job_id}
    assert fail(jq, held, "dead") == {job_id}
    assert job(jq, job_id).status == JobStatus.DEAD
    return stale


def test_the_fence_goes_on_through_every_way_back_to_pending(jq):
    j = jq.enqueue("t", {}, max_attempts=1)
    fences = [_die(jq, j.id).fence]
    assert job(jq, j.id).fence == 1
    assert jq.requeue_dead([j.id]) == [j.id]
    fences.append(_die(jq, j.id).fence)
    assert jq.retry(j.id).fence == 2  # a retry of the dead job
    fences.append(_die(jq, j.id).fence)
    assert jq.requeue_dead() == [j.id]  # all of them, the CLI's batches
    # Live statuses keep it too.
    (held,) = claim(jq)
    fences.append(held.fence)
    assert fail(jq, held, "retryable", retry_in=0) == {j.id}
    assert jq.retry(j.id, if_status="retryable", if_fence=4).fence == 4
    (held,) = claim(jq)
    fences.append(held.fence)
    assert complete(jq, held) == {j.id}
    assert jq.retry(j.id).fence == 5
    assert fences == [1, 2, 3, 4, 5]
    assert job(jq, j.id).attempt == 0


def _complete_in(jq: JobQueue, stale: Claim) -> bool:
    connect: Any = psycopg.connect if is_pg(jq) else sqlite3.connect
    with contextlib.closing(connect(jq.url.url if is_pg(jq) else jq.url.path)) as conn:
        written = jq.backend.job_complete_in(
            connection=conn, completion=Completion(stale, '"stale"'), delete=False
        )
        conn.commit()
    return bool(written)


def test_a_holder_stale_from_before_a_requeue_is_refused_after_its_worker_claims_again(jq):
    """F2: worker W held attempt 1 (fence 1) of a max_attempts=1 job, went
    silent, the job was rescued into the dead letters and requeued, and W
    claimed it again at attempt 1. The old claim must match nothing."""
    j = jq.enqueue("t", {}, max_attempts=1)
    stale = _die(jq, j.id)
    assert jq.requeue_dead([j.id]) == [j.id]
    (again,) = claim(jq)
    assert (again.worker_id, again.attempt) == (stale.worker_id, stale.attempt)
    assert claim_of(again) != stale
    assert jq.backend.job_start_many(claims=[claim_of(again)]) == {j.id}
    # The stale execution's writes: its complete_in, its outcomes.
    assert not _complete_in(jq, stale)
    assert complete(jq, again, claim_=stale) == set()
    assert fail(jq, again, "retryable", claim_=stale) == set()
    assert fail(jq, again, "dead", claim_=stale) == set()
    now = job(jq, j.id)
    assert (now.status, now.fence, now.worker_id) == (JobStatus.RUNNING, 2, WORKER)
    # The new holder's own write goes through.
    assert complete(jq, again, '"fresh"') == {j.id}
    assert job(jq, j.id).result == "fresh"


def _move_as_version_17(jq: JobQueue, job_id: int, errors: str) -> None:
    """Dead-letter held job ``job_id`` as jobkeeper 17 did (a worker of that
    version during a rolling deploy): no fence column named; ``errors`` is
    the dead letter's (JSON)."""
    cast = "CAST(? AS jsonb)" if is_pg(jq) else "?"
    sql(
        jq,
        "INSERT INTO jobkeeper_dead_letters (id, queue, task, args, priority, attempt, "
        "max_attempts, scheduled_at, created_at, attempted_at, finished_at, unique_key, "
        "errors, result, reason, serial_key, crashes) "
        "SELECT id, queue, task, args, priority, attempt, max_attempts, scheduled_at, "
        f"created_at, attempted_at, scheduled_at, unique_key, {cast}, result, 'boom', "
        "serial_key, crashes FROM jobkeeper_jobs WHERE id = ?",
        [errors, job_id],
    )
    sql(jq, "DELETE FROM jobkeeper_jobs WHERE id = ?", [job_id])


def _errors(n: int) -> str:
    return "[" + ",".join(f'{{"attempt": {i + 1}, "error": "boom"}}' for i in range(n)) + "]"


def test_migration_18_gives_dead_letters_of_older_versions_a_fence_to_go_on_from(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead letters moved before version 18, or by a worker of 17 after it,
    recorded no fence: each goes on from the most of its attempts and its
    errors entries (no claim adds more than one of each), never from 0."""
    with JobQueue(db_url) as jq:
        migrate_to(jq, 17, monkeypatch)
        first = jq.enqueue("t", {}, queue="a", max_attempts=3)
        (held,) = claim(jq, "a")
        _move_as_version_17(jq, first.id, _errors(1))  # attempt 1, fence 1
        # Requeued before (errors kept): more entries than attempts.
        second = jq.enqueue("t", {}, queue="b", max_attempts=3)
        (held,) = claim(jq, "b")
        _move_as_version_17(jq, second.id, _errors(3))
        assert jq.migrate() == jq.backend.schema_expected() == 18
        # A worker of version 17 beside the migrated schema; two started
        # attempts handed back (an errors entry each, the attempt not spent).
        third = jq.enqueue("t", {}, queue="c", max_attempts=3)
        for _ in range(2):
            (held,) = claim(jq, "c")
            assert fail(jq, held, "released") == {third.id}
        (held,) = claim(jq, "c")
        assert (held.attempt, held.fence, len(held.errors)) == (1, 3, 2)
        _move_as_version_17(jq, third.id, _errors(3))

        want = {first.id: 1, second.id: 3, third.id: 3}
        assert {i: job(jq, i).fence for i in want} == want
        assert jq.requeue_dead() == sorted(want)
        assert {i: job(jq, i).fence for i in want} == want
        for queue, j in zip("abc", (first, second, third), strict=True):
            (again,) = claim(jq, queue)
            assert (again.attempt, again.fence) == (1, want[j.id] + 1)
        # The dead letters of this version record the fence: exact again.
        assert fail(jq, again, "dead") == {third.id}
        assert job(jq, third.id).fence == 4
        assert jq.requeue_dead([third.id]) == [third.id]
        (again,) = claim(jq, "c")
        assert again.fence == 5
