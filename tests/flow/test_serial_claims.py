"""Which jobs a claim of a serial queue takes, on both backends, wherever the
takeable jobs lie: near the queue's head (many shallow keys), behind
thousands of jobs of held keys (few deep keys, found by walking the keys),
or past the bound on keys (the walk over the queue again, longer).

The rule (DESIGN, "serial keys"): in claim order (priority, scheduled_at,
id), a claim takes unkeyed jobs, and a keyed job only while it is its key's
first available job in the queue and no job of the key is held anywhere; at
most ``limit`` jobs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobkeeper import JobQueue
from support.db import sql

_examples = itertools.count()


def claim(jq: JobQueue, queue: str, limit: int, worker: str = "w1") -> set[int]:
    return {j.id for j in jq.backend.job_claim(worker_id=worker, queue=queue, limit=limit)}


def hold(jq: JobQueue, keys: list[str], queue: str) -> None:
    """Hold ``keys``: one job of each, in ``queue``, claimed by worker "h"."""
    if not keys:
        return
    jq.enqueue_many([("t", {}, {"queue": queue, "serial_key": key}) for key in keys])
    assert len(claim(jq, queue, limit=len(keys), worker="h")) == len(keys)


def expected(jq: JobQueue, queue: str, limit: int) -> set[int]:
    """The rule, computed from the rows."""
    rows = sql(
        jq,
        "SELECT id, serial_key FROM jobkeeper_jobs WHERE queue = ? AND status = 'available' "
        "ORDER BY priority, scheduled_at, id",
        [queue],
    )
    held = {
        key
        for (key,) in sql(
            jq,
            "SELECT serial_key FROM jobkeeper_jobs "
            "WHERE status IN ('claimed', 'running') AND serial_key IS NOT NULL",
        )
    }
    seen: set[str] = set()
    taken: list[int] = []
    for job_id, key in rows:
        if key is None:
            taken.append(job_id)
        elif key not in seen:
            seen.add(key)
            if key not in held:
                taken.append(job_id)
    return set(taken[:limit])


def test_a_key_behind_a_deep_held_key_is_found(jq):
    # 600 jobs of a held key fill the head a claim of 5 first walks (266
    # jobs); the walk over the keys finds the others' first jobs.
    jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "deep"})] * 600)
    later = jq.enqueue_many(
        [("t", {}, {"queue": "q", "serial_key": key}) for key in ("b", "c", "b")]
        + [("t", {}, {"queue": "q"})]
    )
    hold(jq, ["deep"], queue="elsewhere")
    assert claim(jq, "q", limit=5) == {later[0].id, later[1].id, later[3].id}


def test_the_walk_over_keys_keeps_claim_order_across_keys(jq):
    jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "deep"})] * 400)
    low = jq.enqueue_many(
        [("t", {}, {"queue": "q", "serial_key": f"k{i}", "priority": 5}) for i in range(3)]
    )
    high = jq.enqueue_many(
        [("t", {}, {"queue": "q", "serial_key": f"k{i}", "priority": 1}) for i in range(3, 6)]
    )
    hold(jq, ["deep"], queue="elsewhere")
    assert claim(jq, "q", limit=4) == {job.id for job in high} | {low[0].id}


def test_more_keys_than_the_walk_over_keys_allows_falls_back_to_a_longer_walk(jq):
    # A claim of 1 walks 258 jobs, then at most 64 keys: 100 keys behind the
    # held one send it to the next round's walk of 2,064 jobs.
    jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "deep"})] * 300)
    shallow = jq.enqueue_many(
        [("t", {}, {"queue": "q", "serial_key": f"s{i}"}) for i in range(100)]
    )
    hold(jq, ["deep"], queue="elsewhere")
    assert claim(jq, "q", limit=1) == {shallow[0].id}
    assert claim(jq, "q", limit=100) == {job.id for job in shallow[1:]}


def test_unkeyed_jobs_behind_deep_keys_fill_a_short_claim(jq):
    jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "deep"})] * 500)
    tail = jq.enqueue_many([("t", {}, {"queue": "q"})] * 3)
    hold(jq, ["deep"], queue="elsewhere")
    assert claim(jq, "q", limit=10) == {job.id for job in tail}


def test_a_full_claim_takes_no_unkeyed_job_behind_its_last_keyed_one(jq):
    keyed = jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": f"k{i}"}) for i in range(4)])
    jq.enqueue_many([("t", {}, {"queue": "q"})] * 2)
    assert claim(jq, "q", limit=4) == {job.id for job in keyed}


def deep_held_keys_then_shallow(jq: JobQueue, keys: int, depth: int, shallow: int) -> list[int]:
    """``keys`` keys of ``depth`` jobs each, interleaved at the head of queue
    "q" and held there (their first jobs claimed by worker "h"), then
    ``shallow`` one-job keys with an unkeyed job after every third: the
    jobs after the held keys' (in claim order)."""
    jq.enqueue_many(
        [
            ("t", {}, {"queue": "q", "serial_key": f"deep{k}"})
            for _ in range(depth)
            for k in range(keys)
        ]
    )
    assert len(claim(jq, "q", limit=keys, worker="h")) == keys
    behind = []
    for i in range(shallow):
        behind.append(("t", {}, {"queue": "q", "serial_key": f"s{i}"}))
        if i % 3 == 2:
            behind.append(("t", {}, {"queue": "q"}))
    return [job.id for job in jq.enqueue_many(behind)]


@pytest.mark.parametrize("limit", [1, 5, 40])
@pytest.mark.parametrize(("keys", "depth"), [(20, 150), (70, 45)], ids=["20-held", "70-held"])
def test_jobs_behind_many_deep_held_keys_are_found(jq, limit, keys, depth):
    # 3,000 jobs of held keys fill a claim's first two head walks (up to
    # 2,688 jobs), and more keys follow than a walk over the keys takes: the
    # held keys are left out of the walk of the head (20), or, more than 64,
    # walked past as before (70); the claim takes what follows them,
    # unkeyed jobs included.
    behind = deep_held_keys_then_shallow(jq, keys=keys, depth=depth, shallow=300)
    want = expected(jq, "q", limit)
    assert want <= set(behind) and len(want) == limit
    assert claim(jq, "q", limit=limit) == want
    rest = expected(jq, "q", 500)
    assert claim(jq, "q", limit=500) == rest == set(behind) - want


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    deep=st.integers(min_value=0, max_value=700),
    deep_held=st.booleans(),
    rest=st.lists(
        st.tuples(st.one_of(st.none(), st.integers(0, 45)), st.integers(0, 3)),
        max_size=90,
    ),
    held=st.sets(st.integers(0, 45), max_size=30),
    limit=st.integers(min_value=1, max_value=40),
)
def test_a_claim_takes_what_the_rule_says(jq, deep, deep_held, rest, held, limit):
    # A fresh queue and key space per example: earlier examples' jobs stay,
    # as other queues' keys do in a real table.
    n = next(_examples)
    queue, key = f"q{n}", f"e{n}-k{{}}".format
    jobs = [("t", {}, {"queue": queue, "serial_key": key("deep"), "priority": 0})] * deep
    jobs += [
        ("t", {}, {"queue": queue, "serial_key": None if k is None else key(k), "priority": p})
        for k, p in rest
    ]
    if jobs:
        jq.enqueue_many(jobs)
    hold(jq, sorted(key(k) for k in held) + ([key("deep")] if deep_held else []), f"h{n}")
    want = expected(jq, queue, limit)
    assert claim(jq, queue, limit) == want


SERIAL_INDEXES = (
    "jobkeeper_jobs_serial_queue_idx",
    "jobkeeper_jobs_serial_idx",
    "jobkeeper_jobs_serial_first_idx",
)


def _probes(plan: dict[str, Any]) -> int:
    """Index probes for a key's first job or its holder in one plan: the
    loops of every scan on the two serial indexes."""
    own = int(plan.get("Actual Loops", 0)) if plan.get("Index Name") in SERIAL_INDEXES else 0
    return own + sum(_probes(child) for child in plan.get("Plans", []))


def _claim_index_pages(plan: dict[str, Any]) -> int:
    """Pages (index and heap) that every scan on the claim index touched in
    one plan. Not rows: entries an index condition turns down inside the
    index are counted nowhere."""
    own = 0
    if plan.get("Index Name") == "jobkeeper_jobs_claim_idx":
        own = int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    return own + sum(_claim_index_pages(child) for child in plan.get("Plans", []))


def claim_with_plans(url: str, queue: str, limit: int) -> tuple[set[int], list[dict[str, Any]]]:
    """Claim through jobkeeper_claim_limited with auto_explain loaded in this
    session only, which hands the plans of the function's statements back as
    notices: the ids claimed and those plans."""
    plans: list[dict[str, Any]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(
            lambda notice: (
                plans.append(json.loads(notice.message_primary.split("plan:", 1)[1])["Plan"])
                if "plan:" in (notice.message_primary or "")
                else None
            )
        )
        conn.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("log_min_duration", "0"),
            ("log_analyze", "on"),
            ("log_nested_statements", "on"),
            ("log_buffers", "on"),
            ("log_format", "json"),
            ("log_level", "notice"),
        ):
            conn.execute(f"SET auto_explain.{setting} = '{value}'")
        claimed = {
            row[0]
            for row in conn.execute(
                "SELECT id FROM jobkeeper_claim_limited(%s, 'w', %s)", (queue, limit)
            )
        }
    assert plans, "auto_explain sent no plan"
    return claimed, plans


def claim_as_the_rule_says(
    jq: JobQueue, url: str, limit: int
) -> tuple[set[int], list[dict[str, Any]]]:
    """Claim up to ``limit`` from queue "q" with the plans (see
    :func:`claim_with_plans`), check the ids against the rule, and return
    them with the plans."""
    want = expected(jq, "q", limit)
    claimed, plans = claim_with_plans(url, "q", limit)
    assert claimed == want
    return claimed, plans


@pytest.fixture
def pg_jq(pg_url: str) -> Iterator[JobQueue]:
    """A migrated JobQueue on PostgreSQL only (its claim function's plans)."""
    with JobQueue(pg_url) as jq:
        jq.migrate()
        yield jq


def test_a_claim_behind_a_deep_held_key_probes_the_keys_not_its_jobs(
    pg_jq: JobQueue, pg_url: str
) -> None:
    """The claim walked the queue in claim order and probed each job of a
    held key for "first of its key" before it reached a key it could take:
    5,000 probes here (benchmarks/flow.py, all keyed over 50 keys: 334
    jobs/s). It now walks the queue's keys instead, and not another queue's
    (3,000 here)."""
    jq = pg_jq
    jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": "deep"})] * 5000)
    jq.enqueue_many([("t", {}, {"queue": "other", "serial_key": f"o{i}"}) for i in range(3000)])
    firsts = jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": f"k{i}"}) for i in range(10)])
    hold(jq, ["deep"], queue="elsewhere")
    claimed, plans = claim_with_plans(pg_url, "q", 5)
    assert claimed == {job.id for job in firsts[:5]}
    probes = sum(_probes(plan) for plan in plans)
    assert probes < 100, probes


def test_a_full_claim_reads_the_queue_only_up_to_its_last_job(pg_jq: JobQueue, pg_url: str) -> None:
    """Unkeyed jobs are looked for up to the claim's last job, a bound that
    was one row comparison, (priority, scheduled_at, id) <= cutoff; on
    PostgreSQL 15 an index scan ends on a row comparison's first column
    only, so among one bulk enqueue's jobs (equal priority and scheduled_at)
    it read on to the queue's end: 20,000 entries past a claim of 5 here."""
    jq = pg_jq
    jobs = jq.enqueue_many(
        [("t", {}, {"queue": "q", "serial_key": f"k{i}"}) for i in range(10)]
        + [("t", {}, {"queue": "q", "serial_key": "deep"})] * 20_000
    )
    claimed, plans = claim_with_plans(pg_url, "q", 5)
    assert claimed == {job.id for job in jobs[:5]}
    pages = sum(_claim_index_pages(plan) for plan in plans)
    assert pages < 60, pages


def _numbered(plan: dict[str, Any]) -> int:
    """Rows the head walk numbered (its row_number window) in one plan."""
    own = int(plan.get("Actual Rows", 0)) if plan.get("Node Type") == "WindowAgg" else 0
    return own + sum(_numbered(child) for child in plan.get("Plans", []))


def test_a_claim_behind_deep_held_keys_walks_past_their_jobs_unnumbered(
    pg_jq: JobQueue, pg_url: str
) -> None:
    """With 20 held keys of 1,000 jobs at the head and 2,000 one-job keys
    behind, the head walk grew until it held the whole queue: its rounds
    numbered and grouped 41,000 jobs by key (at 150,000 jobs a claim took
    235-300 ms). From the second round on, the held keys' jobs are read
    past, unnumbered: 266 + 2,128 jobs, then the second round's 2,128 again."""
    jq = pg_jq
    behind = deep_held_keys_then_shallow(jq, keys=20, depth=1000, shallow=2000)
    claimed, plans = claim_as_the_rule_says(jq, pg_url, 5)
    assert claimed <= set(behind)
    numbered = sum(_numbered(plan) for plan in plans)
    assert numbered < 6000, numbered


def test_few_keys_deep_in_the_queue_are_walked_before_a_longer_head(
    pg_jq: JobQueue, pg_url: str
) -> None:
    """50 keys of 400 jobs each, enqueued key after key (a bulk enqueue per
    customer): a claim's first head walk (296 jobs) holds one key. The walk
    over the keys that answers came only after a head walk of 2,368 jobs,
    each numbered and grouped: 7.6 ms a claim of 20. It now comes first."""
    jq = pg_jq
    for key in range(50):
        jq.enqueue_many([("t", {}, {"queue": "q", "serial_key": f"k{key:02}"})] * 400)
    claimed, plans = claim_as_the_rule_says(jq, pg_url, 20)
    assert len(claimed) == 20
    numbered = sum(_numbered(plan) for plan in plans)
    assert numbered < 1000, numbered


def test_many_keys_behind_held_ones_cost_no_more_walks_over_keys(
    pg_jq: JobQueue, pg_url: str
) -> None:
    """100 held keys of 30 jobs at the head, 3,000 one-job keys behind: no
    walk over the keys can answer, and the third head walk does. Walking the
    next round's keys early in every round (a quarter of each head, not a
    32nd) took 25% longer at 30,000 keys (helper-69): 1,063 serial index
    probes here, against version 15's 480. Only the first round walks
    early, and the second then walks none: as many as before."""
    jq = pg_jq
    behind = deep_held_keys_then_shallow(jq, keys=100, depth=30, shallow=3000)
    claimed, plans = claim_as_the_rule_says(jq, pg_url, 20)
    assert claimed <= set(behind)
    probes = sum(_probes(plan) for plan in plans)
    assert probes < 600, probes
