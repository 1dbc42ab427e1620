"""The unkeyed jobs of a serial queue carry a flag (``serial_unkeyed``,
schema version 17) that indexes them apart from the keyed ones, so that a
claim short of keyed jobs fills itself without reading past every keyed job
of the queue. Every write of an unkeyed job sets it where the queue is
serial; a job that misses it (written by version 16 code) is still taken,
when a walk of the queue's head reaches it.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import time
from datetime import timedelta
from typing import Any

from backends.helpers import claim as claim_all
from backends.helpers import complete, kill
from e2e.helpers import processes
from jobkeeper import JobQueue
from jobkeeper.backends.postgres.plans import COPY_MIN_JOBS
from jobkeeper.maintenance.periodic import PeriodicEnqueuer
from support.db import migrate_to, sql
from support.waiting import wait_for

from .test_serial_claims import claim, claim_as_the_rule_says, hold
from .test_workers import SETTINGS, done, records


def flagged(jq: JobQueue) -> set[int]:
    return {row[0] for row in sql(jq, "SELECT id FROM jobkeeper_jobs WHERE serial_unkeyed")}


def ids(jobs: list[Any]) -> set[int]:
    return {job.id for job in jobs}


def test_every_write_of_an_unkeyed_job_into_a_serial_queue_flags_it(jq):
    # Before the queue is serial: a dead letter, a finished job, pending ones.
    dead = kill(jq, jq.enqueue("t", {}, queue="q"))
    jq.enqueue("t", {}, queue="q")
    jq.enqueue("t", {}, queue="q")
    finished, finished_too = claim_all(jq, "q")
    assert complete(jq, finished) == {finished.id}
    assert complete(jq, finished_too) == {finished_too.id}
    pending = [jq.enqueue("t", {}, queue="q"), jq.enqueue("t", {}, queue="q", delay=3600)]
    elsewhere = jq.enqueue("t", {}, queue="other")
    assert flagged(jq) == set()

    # The first keyed job marks the queue and flags its unfinished jobs.
    keyed = jq.enqueue("t", {}, queue="q", serial_key="k")
    assert flagged(jq) == ids(pending)

    # Each way an unkeyed job is written from then on.
    written = [
        jq.enqueue("t", {}, queue="q"),  # one statement, outside a transaction
        jq.enqueue("t", {}, queue="q", delay=60),  # in a transaction
        *jq.enqueue_many([("t", {}, {"queue": "q"})] * 3),
        *jq.enqueue_many([("t", {}, {"queue": "q"})] * COPY_MIN_JOBS),  # COPY on PostgreSQL
        *jq.enqueue_many([("t", {}, {"queue": "q", "delay": 60})] * COPY_MIN_JOBS),
        asyncio.run(jq.enqueue_async("t", {}, queue="q")),
        jq.retry(finished.id),
    ]
    assert jq.requeue_dead([dead.id]) == [dead.id]
    # A filtered retry's batch.
    assert jq.backend.job_retry_many(job_ids=[finished_too.id]) == [finished_too.id]
    # A batch that marks its queue flags its own unkeyed jobs too.
    mixed = jq.enqueue_many(
        [("t", {}, {"queue": "q2"}), ("t", {}, {"queue": "q2", "serial_key": "k2"})]
    )
    keyed_again = jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "k3"})] * 2)
    unflagged_elsewhere = jq.enqueue_many([("t", {}, {"queue": "other"})] * COPY_MIN_JOBS)

    jq.periodic(every=1, task="t", name="beat", queue="q")
    backend = jq.backend.dedicated()
    try:
        ticking = PeriodicEnqueuer(backend, list(jq.periodics.values()))
        now = jq.backend.db_now()
        ticking.run_once(now=now)
        ticking.run_once(now=now + timedelta(seconds=2.5))
    finally:
        backend.close()
    ticked = {
        row[0]
        for row in sql(
            jq,
            "SELECT id FROM jobkeeper_jobs WHERE task = 't' AND queue = 'q' AND id > ?",
            [max(ids(written))],
        )
    }
    ticked -= ids(keyed_again) | ids(mixed) | {dead.id}
    assert len(ticked) >= 2

    want = ids(pending) | ids(written) | {dead.id, finished_too.id, mixed[0].id} | ticked
    assert flagged(jq) == want
    never = ids([keyed, elsewhere, mixed[1], *keyed_again, *unflagged_elsewhere])
    assert not never & flagged(jq)


UNKEYED_INDEX = "jobkeeper_jobs_serial_unkeyed_idx"


def _unkeyed_scans(plan: dict[str, Any]) -> list[tuple[str, int]]:
    """The scans of the jobs table in one plan that look for unkeyed jobs
    (through their index, or with "serial_key IS NULL" as their whole
    filter), each with the index or scan it used and the pages (index and
    heap) it touched."""
    own = []
    looks = plan.get("Index Name") == UNKEYED_INDEX or plan.get("Filter") == "(serial_key IS NULL)"
    if plan.get("Relation Name") == "jobkeeper_jobs" and looks:
        pages = int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
        own.append((str(plan.get("Index Name", plan["Node Type"])), pages))
    return own + [scan for child in plan.get("Plans", []) for scan in _unkeyed_scans(child)]


def test_a_short_claim_finds_unkeyed_jobs_without_reading_the_keyed_ones(pg_url):
    """A claim of 100 over 50 keys, 20 of them held, takes the 30 free keys'
    first jobs and fills itself with the unkeyed jobs at the queue's end. It
    walked the claim index past all 20,000 keyed jobs to find them (9 ms a
    claim at 100,000 jobs); it now reads them from their own index."""
    with JobQueue(pg_url) as jq:
        jq.migrate()
        for start in range(0, 20_000, 5_000):
            jq.enqueue_many(
                [("t", {}, {"queue": "q", "serial_key": f"k{(start + i) % 50}"})
                 for i in range(5_000)]
            )  # fmt: skip
        tail = jq.enqueue_many([("t", {}, {"queue": "q"})] * 10)
        sql(pg_url, "VACUUM ANALYZE jobkeeper_jobs")
        hold(jq, [f"k{i}" for i in range(20)], "elsewhere")
        claimed, plans = claim_as_the_rule_says(jq, pg_url, 100)
        assert ids(tail) <= claimed and len(claimed) == 40
        scans = [scan for plan in plans for scan in _unkeyed_scans(plan)]
        assert {index for index, _ in scans} == {UNKEYED_INDEX}
        pages = sum(pages for _, pages in scans)
        assert pages < 40, pages


def test_an_unflagged_unkeyed_job_is_taken_when_the_head_reaches_it(jq):
    """As a producer of version 16 writes it during a rolling deploy."""
    jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "deep"})] * 400)
    straggler = jq.enqueue("t", {}, queue="q")
    near = jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "near"})] * 3)
    sql(jq, "UPDATE jobkeeper_jobs SET serial_unkeyed = NULL WHERE id = ?", [straggler.id])
    hold(jq, ["deep"], "elsewhere")
    # Behind 400 jobs of a held key it does not fill a short claim ...
    assert claim(jq, "q", limit=10) == {near[0].id}
    # ... and is taken once the head's walk reaches it.
    sql(jq, "DELETE FROM jobkeeper_jobs WHERE serial_key = 'deep' AND status = 'available'")
    assert claim(jq, "q", limit=10) == {straggler.id}


def test_migration_17_flags_a_serial_queues_unfinished_unkeyed_jobs(db_url, monkeypatch):
    with JobQueue(db_url) as jq:
        migrate_to(jq, 16, monkeypatch)
        # Rows as version 16 writes them.
        true = "true" if db_url.startswith("postgres") else "1"
        sql(jq, f"INSERT INTO jobkeeper_queues (name, serial) VALUES ('q', {true})")
        rows = [
            ("q", "available", None),
            ("q", "scheduled", None),
            ("q", "running", None),
            ("q", "completed", None),
            ("q", "available", "k"),
            ("other", "available", None),
        ]
        made = []
        for queue, status, key in rows:
            worker = "'w'" if status == "running" else "NULL"
            sql(
                jq,
                "INSERT INTO jobkeeper_jobs (queue, task, args, status, serial_key, worker_id) "
                f"VALUES (?, 't', '{{}}', ?, ?, {worker})",
                [queue, status, key],
            )
            made.append(int(sql(jq, "SELECT max(id) FROM jobkeeper_jobs")[0][0]))
        assert jq.migrate() == jq.backend.schema_expected() >= 17
        assert flagged(jq) == set(made[:3])


def test_rescued_unkeyed_jobs_still_fill_short_claims(db_url, tmp_path):
    """Real workers, one SIGKILLed while it holds unkeyed jobs of a serial
    queue whose keyed jobs run one at a time: the rescued jobs keep their
    flag, so the survivor runs them beside the keyed chains, not after."""
    record = tmp_path / "runs.txt"
    with JobQueue(db_url) as jq:
        jq.migrate()
        keyed = [
            ("timed", {"seconds": 0.0, "record": str(record), "key": key},
             {"queue": "q", "serial_key": key})
            for key in ("a", "b")
            for _ in range(300)
        ]  # fmt: skip
        jq.enqueue_many(keyed)
        unkeyed = jq.enqueue_many(
            [("timed", {"seconds": 1.0, "record": str(record)}, {"queue": "q"})] * COPY_MIN_JOBS
        )
        assert flagged(jq) == ids(unkeyed)
        argv = [sys.executable, "-m", "jobkeeper", "--database", db_url, "worker"]
        argv += ["--app", "tests.flow.app:jq", "--queue", "q", "--prefetch", "0"]
        with processes(tmp_path) as procs:
            victim = procs.spawn([*argv, "--concurrency", "8"], settings=SETTINGS, name="victim")

            def holds_unkeyed() -> int | None:
                rows = sql(
                    db_url,
                    "SELECT count(*) FROM jobkeeper_jobs WHERE serial_key IS NULL "
                    "AND status IN ('claimed', 'running') AND worker_id LIKE ?",
                    [f"%:{victim.pid}:%"],
                )
                return int(rows[0][0]) or None

            wait_for(holds_unkeyed, what="the victim to hold unkeyed jobs")
            victim.send_signal(signal.SIGKILL)
            killed_at = time.time()
            procs.spawn([*argv, "--concurrency", "8"], settings=SETTINGS, name="survivor")
            wait_for(lambda: done(db_url) == 600 + COPY_MIN_JOBS, timeout=120, what="all jobs")
    runs = records(record)
    # A job the victim ran but did not ack runs again (at least once).
    assert len({job_id for job_id, _, _, _, key in runs if key != "-"}) == 600
    keyed_ends = [end for _, _, _, end, key in runs if key != "-"]
    unkeyed_starts = sorted(start for _, _, start, _, key in runs if key == "-")
    # Every unkeyed job ran, the rescued ones after the kill, and some of them
    # before the keyed chains ended.
    assert {job_id for job_id, _, _, _, key in runs if key == "-"} == ids(unkeyed)
    after_kill = [start for start in unkeyed_starts if start > killed_at]
    assert after_kill and after_kill[0] < max(keyed_ends)
    for key in ("a", "b"):
        spans = sorted((s, e) for _, _, s, e, k in runs if k == key)
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans))
