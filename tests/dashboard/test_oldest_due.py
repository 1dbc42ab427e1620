"""The overview's and /metrics' oldest due job per queue: right, and read down
the claim index rather than by sorting the backlog.

Found by a break-test: at 600,000 available jobs ``queue_oldest_due`` sorted
every one of them (an external merge on disk, 1.3 s) on each overview load
and scrape.
"""

from __future__ import annotations

import json
import random
import sqlite3

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.backends import cockpit
from support.db import is_pg, now_sql, sql

#: Available jobs behind the plan checks: every one read and sorted before.
BACKLOG = 3000


def _brute_force(jq: JobQueue) -> dict[str, int]:
    """Per queue, the id of its oldest job that could run now, from every row."""
    rows = sql(
        jq,
        f"SELECT queue, id, scheduled_at FROM jobkeeper_jobs WHERE status = 'available' "
        f"OR (status IN ('scheduled', 'retryable') AND scheduled_at <= {now_sql(jq)})",
    )
    oldest: dict[str, tuple[object, int]] = {}
    for queue, job_id, at in rows:
        if queue not in oldest or (at, job_id) < oldest[queue]:
            oldest[queue] = (at, job_id)
    return {queue: job_id for queue, (_, job_id) in oldest.items()}


def _age_by(jq: JobQueue, seconds: float, where: str) -> None:
    shift = f"make_interval(secs => {seconds})" if is_pg(jq) else str(seconds)
    sql(jq, f"UPDATE jobkeeper_jobs SET scheduled_at = scheduled_at - {shift} WHERE {where}")


@pytest.mark.parametrize("walk", [cockpit.OLDEST_WALK_PAIRS, 3])
def test_oldest_due_is_the_oldest_of_every_priority_and_due_job(jq, monkeypatch, walk):
    # walk=3: more (queue, priority) pairs than the walk takes, so the
    # one-pass fallback answers.
    monkeypatch.setattr(cockpit, "OLDEST_WALK_PAIRS", walk)
    rng = random.Random(88)
    queues = ["a", "b", "c", "d"]
    jobs = jq.enqueue_many(
        [
            (
                "t",
                {"i": i},
                {"queue": rng.choice(queues[:3]), "priority": rng.choice([-5, 0, 3, 9])},
            )
            for i in range(200)
        ]
    )
    # Spread their times, and make the oldest of some queues a low priority's job.
    for job in jobs:
        _age_by(jq, rng.uniform(0, 5000), f"id = {job.id}")
    later = jq.enqueue_many(
        [("t", {"i": i}, {"queue": rng.choice(queues), "delay": 3600}) for i in range(30)]
    )
    # Due but not staged yet (no scheduler ran): some older than every
    # available job of their queue, and queue d has only these.
    for job in later[:20]:
        _age_by(jq, 3600 + rng.uniform(0, 8000), f"id = {job.id}")
    oldest = jq.oldest_due()
    assert {queue: job_id for queue, (job_id, _) in oldest.items()} == _brute_force(jq)
    assert all(age >= 0 for _, age in oldest.values())


@pytest.mark.parametrize("walk", [cockpit.OLDEST_WALK_PAIRS, 1])
def test_oldest_due_breaks_a_tie_on_the_smaller_id(jq, monkeypatch, walk):
    # walk=1: the fallback, whose SQLite query returned the first row of the
    # oldest time it met, the lowest priority's (break-test), not the smallest id.
    monkeypatch.setattr(cockpit, "OLDEST_WALK_PAIRS", walk)
    ids = [
        job.id for job in jq.enqueue_many([("t", {"i": i}, {"priority": 5 - i}) for i in range(3)])
    ]
    sql(
        jq,
        "UPDATE jobkeeper_jobs SET scheduled_at = (SELECT min(scheduled_at) FROM jobkeeper_jobs)",
    )
    assert jq.oldest_due()["default"][0] == min(ids)


def test_oldest_due_breaks_a_tie_of_unstaged_due_jobs_on_the_smaller_id(jq):
    # Due but not staged yet (no scheduler ran), several at the same time.
    ids = [
        job.id
        for job in jq.enqueue_many(
            [("t", {"i": i}, {"queue": "late", "delay": 3600, "priority": 5 - i}) for i in range(3)]
        )
    ]
    _age_by(jq, 7200, "queue = 'late'")
    sql(
        jq,
        "UPDATE jobkeeper_jobs SET scheduled_at = "
        "(SELECT min(scheduled_at) FROM jobkeeper_jobs) WHERE queue = 'late'",
    )
    assert jq.oldest_due()["late"][0] == min(ids)


def _rows_read_pg(jq: JobQueue, name: str) -> int:
    from jobkeeper.backends.postgres.queries import QUERIES

    query = QUERIES[name]
    with psycopg.connect(jq.url.url, autocommit=True) as conn:
        conn.execute("ANALYZE jobkeeper_jobs")
        (plan,) = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", {"pairs": cockpit.OLDEST_WALK_PAIRS}
        ).fetchone()
    plan = plan if isinstance(plan, list) else json.loads(plan)

    def rows(node: dict) -> int:
        here = int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
        return max([here, *(rows(child) for child in node.get("Plans", []))])

    return rows(plan[0]["Plan"])


def _steps_sqlite(jq: JobQueue, name: str) -> int:
    from jobkeeper.backends.sqlite.queries import QUERIES

    conn = sqlite3.connect(jq.url.path)
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(tick, 100)  # every 100 VM instructions
    try:
        conn.execute(QUERIES[name], {"pairs": cockpit.OLDEST_WALK_PAIRS, "now": None}).fetchall()
    finally:
        conn.close()
    return steps


def test_oldest_due_reads_a_few_rows_of_a_big_backlog(jq):
    jq.enqueue_many(
        [("t", {"i": i}, {"queue": f"q{i % 3}", "priority": i % 2}) for i in range(BACKLOG)]
    )
    if is_pg(jq):
        # The most rows any plan node produced: the 6 pairs' first jobs, not
        # the 3,000 the sort read.
        assert _rows_read_pg(jq, "queue_oldest_due") < 50
    else:
        # Before: about 1,500 (hundreds of VM instructions) for the 3,000 rows.
        assert _steps_sqlite(jq, "queue_oldest_due") < 100
    assert set(jq.oldest_due()) == {"q0", "q1", "q2"}
