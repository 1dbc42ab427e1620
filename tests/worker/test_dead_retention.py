"""Issue 15, item 6: dead letters kept for ``dead_retention`` seconds (a
``JobQueue`` setting; default None keeps them until ``dead purge``), then
deleted by the workers' pruner, on both backends.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from backends.helpers import kill
from jobkeeper import ConfigError, JobQueue
from jobkeeper.maintenance.pruner import Pruner
from support.db import count, is_pg, sql
from support.waiting import wait_for

from .helpers import running


def age_dead_letters(jq: JobQueue, seconds: int, job_id: int) -> None:
    shift = f"interval '{seconds} seconds'" if is_pg(jq) else str(seconds)
    query = f"UPDATE jobkeeper_dead_letters SET finished_at = finished_at - {shift}"
    sql(jq, query + " WHERE id = ?", [job_id])


def dead_ids(jq: JobQueue) -> set[int]:
    return {job.id for job in jq.list_jobs(status="dead")}


def test_the_backend_prunes_dead_letters_once_the_pinned_time_passes_retention(jq):
    dead = kill(jq, jq.enqueue("t", {}))
    now = jq.backend.db_now()
    assert jq.backend.dead_letter_prune(older_than=3600, limit=10, now=now) == 0
    later = now + timedelta(hours=2)
    assert jq.backend.dead_letter_prune(older_than=3600, limit=10, now=later) == 1
    assert jq.get_job(dead.id) is None


def test_the_pruner_deletes_only_dead_letters_older_than_dead_retention(jq):
    old = kill(jq, jq.enqueue("t", {}))
    young = kill(jq, jq.enqueue("t", {}))
    age_dead_letters(jq, 7200, old.id)
    Pruner(jq.backend, retention=86400, interval=1, dead_retention=3600).run_once()
    assert dead_ids(jq) == {young.id}
    # Without dead_retention (the default), dead letters stay whatever their age.
    age_dead_letters(jq, 7200, young.id)
    Pruner(jq.backend, retention=86400, interval=1).run_once()
    assert dead_ids(jq) == {young.id}


def test_a_worker_prunes_dead_letters_past_its_queues_dead_retention(make_queue):
    jq = make_queue(dead_retention=3600)
    assert jq.settings.dead_retention == 3600
    old = kill(jq, jq.enqueue("t", {}))
    young = kill(jq, jq.enqueue("t", {}))
    age_dead_letters(jq, 7200, old.id)
    with running(jq.worker(queues=["other"])):
        wait_for(lambda: dead_ids(jq) == {young.id}, what="the old dead letter to be pruned")
    assert count(jq, "jobkeeper_dead_letters") == 1


@pytest.mark.parametrize("value", [-1, float("nan"), "1h", 1e12])
def test_a_bad_dead_retention_is_refused(value):
    with pytest.raises(ConfigError, match="dead_retention"):
        JobQueue("sqlite:///unused.db", dead_retention=value)
    assert JobQueue("sqlite:///unused.db").settings.dead_retention is None
