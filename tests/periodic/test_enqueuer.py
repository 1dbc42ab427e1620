"""The periodic enqueuer on both backends, with a pinned clock and rows
fabricated in the past: first sight, once per tick (also across services and
after the jobs are pruned), catch-up after a gap, changed and vanished
definitions, thirty periodics, and twin tick statements racing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timedelta

import pytest

from jobkeeper import Schedule
from jobkeeper.maintenance.periodic import PeriodicEnqueuer
from support.db import sql
from support.threads import run_threads

from .helpers import aligned, app, fabricate, per_task, service, ticks

SECOND = timedelta(seconds=1)


def test_first_sight_starts_from_now_then_every_tick_once(jq):
    jq.periodic(every=1, task="beat")
    worker = service(jq)
    now = jq.backend.db_now()
    worker.run_once(now=now)
    (row,) = jq.periodic_list()
    assert (row.name, row.schedule, row.timezone, row.task) == ("beat", "every 1s", "UTC", "beat")
    assert row.last_tick_at is None and row.since_at >= now - SECOND
    assert ticks(jq.url.url) == []  # nothing owed from before it existed

    later = now + 3.5 * SECOND
    worker.run_once(now=later)
    expected = Schedule(every=1).ticks_between(row.since_at, later)
    assert len(expected) >= 3
    assert ticks(jq.url.url) == expected  # oldest first, each once
    (row,) = jq.periodic_list()
    assert row.last_tick_at == expected[-1]
    assert row.next_tick_at == expected[-1] + SECOND

    # The same pass again, another worker's pass, and a pass after every job
    # was pruned (good_job#731): the record is the periodic row, not the jobs.
    worker.run_once(now=later)
    service(jq).run_once(now=later)
    sql(jq.url.url, "DELETE FROM jobkeeper_jobs")
    worker.run_once(now=later)
    service(jq).run_once(now=later)
    assert ticks(jq.url.url) == []


def test_catch_up_after_a_gap(jq, caplog):
    jq.periodic(every=60, task="report", catch_up=120)
    now = aligned(jq.backend.db_now(), 60, 30)  # hh:mm:30
    service(jq).run_once(now=now)
    # The fleet last passed half an hour ago, and ticked an hour ago.
    since, seen = now - 3600 * SECOND, now - 1800 * SECOND
    fabricate(jq.url.url, "report", since_at=since, last_tick_at=None, seen_at=seen)

    returning = service(jq)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.periodic"):
        returning.run_once(now=now)
    schedule = Schedule(every=60)
    # Due while a worker was still alive (up to seen_at + the slack): all enqueued.
    alive = schedule.ticks_between(since, seen + 10 * SECOND)
    # Missed (no worker ran): within catch_up enqueued, older ones skipped.
    recent = schedule.ticks_between(now - 120 * SECOND, now)
    skipped = schedule.ticks_between(seen + 10 * SECOND, now - 121 * SECOND)
    assert (len(alive), len(recent), len(skipped)) == (30, 2, 28)
    assert ticks(jq.url.url) == alive + recent  # oldest first
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "'report'" in warning and "skipped 28 missed ticks" in warning, warning
    # It names the first and the last tick skipped (the last used to be the
    # boundary of catch_up, which is no tick).
    assert f", {skipped[0].isoformat()} to {skipped[-1].isoformat()}:" in warning, warning
    assert returning.skipped == 28 and returning.enqueued == 32
    # Settled: another worker returning at the same time finds nothing.
    service(jq).run_once(now=now)
    assert len(ticks(jq.url.url)) == 32


def test_catch_up_zero_skips_every_missed_tick(jq, caplog):
    jq.periodic(every=60, task="report", catch_up=0)
    now = aligned(jq.backend.db_now(), 60, 30)
    service(jq).run_once(now=now)
    gone = now - 3600 * SECOND
    fabricate(jq.url.url, "report", since_at=gone, last_tick_at=gone, seen_at=gone)
    returning = service(jq)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.periodic"):
        returning.run_once(now=now)
    assert ticks(jq.url.url) == []
    assert any("skipped 60 missed ticks" in r.getMessage() for r in caplog.records)
    # From its start on, nothing is missed, however late the worker looks.
    returning.run_once(now=now + 600 * SECOND)
    assert ticks(jq.url.url) == Schedule(every=60).ticks_between(now, now + 600 * SECOND)


def test_ticks_just_after_the_last_refresh_follow_catch_up_when_the_fleet_returns_late(jq, caplog):
    # The last worker refreshed the row, then the fleet stopped for an hour.
    # The ticks of the slack after that refresh are missed like the rest of
    # the gap: catch_up=0 skips them all (break-test: they used to be owed
    # for ever and fired an hour late).
    jq.periodic(every=1, task="beat", catch_up=0)
    # Pinned in the past (the first pass must owe nothing), at half a second.
    now = (jq.backend.db_now() - SECOND).replace(microsecond=500_000)
    service(jq).run_once(now=now)
    gone = now - 3600 * SECOND
    fabricate(jq.url.url, "beat", since_at=gone, last_tick_at=gone, seen_at=gone)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.periodic"):
        service(jq).run_once(now=now)
    assert ticks(jq.url.url) == []
    assert any("skipped 3600 missed ticks" in r.getMessage() for r in caplog.records)


def test_ticks_just_after_the_last_refresh_are_owed_while_the_row_is_fresh(jq):
    # Refreshed 15 s ago (a worker that may be paused, or just stopped): the
    # ticks of the following 10 s count as due while it was alive.
    jq.periodic(every=1, task="beat", catch_up=0)
    # Pinned in the past (the first pass must owe nothing), at half a second.
    now = (jq.backend.db_now() - SECOND).replace(microsecond=500_000)
    service(jq).run_once(now=now)
    seen = now - 15 * SECOND
    fabricate(jq.url.url, "beat", since_at=seen, last_tick_at=seen, seen_at=seen)
    service(jq).run_once(now=now)
    owed = Schedule(every=1).ticks_between(seen, seen + 10 * SECOND)
    assert len(owed) == 10 and ticks(jq.url.url) == owed


def test_a_tick_due_while_the_worker_ran_is_never_missed(jq):
    jq.periodic(every=60, task="report", catch_up=0)
    worker = service(jq)
    now = aligned(jq.backend.db_now(), 60, 30)
    worker.run_once(now=now)
    fabricate(jq.url.url, "report", since_at=now)  # first sight at the pinned now
    # The worker notices ten minutes late (a paused process, a long outage):
    # every tick since it started is enqueued, catch_up=0 notwithstanding.
    worker.run_once(now=now + 600 * SECOND)
    assert len(ticks(jq.url.url)) == 10


def test_a_changed_schedule_replaces_the_old_one_for_good(jq, caplog):
    url = jq.url.url
    jq.periodic(every=60, task="sync", name="sync")
    old = service(jq)
    now = aligned(jq.backend.db_now(), 600, 30)
    old.run_once(now=now)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.periodic"):
        new = service(app(url, cron="*/5 * * * *", task="sync", name="sync"))
        new.run_once(now=now)
        # The replacement starts owing ticks from the database's now(): pin it.
        fabricate(url, "sync", since_at=now)
        assert any("replaces 'every 60s'" in r.getMessage() for r in caplog.records)
        (row,) = jq.periodic_list()
        assert (row.schedule, row.timezone) == ("*/5 * * * *", "UTC")

        # The old-code worker keeps running: its passes fire nothing, and even
        # a tick statement of the old schedule changes nothing.
        old.run_once(now=now + 600 * SECOND)
        assert ticks(url) == []
        assert any("does not fire" in r.getMessage() for r in caplog.records)
        stray = jq.backend.periodic_enqueue_tick(
            name="sync",
            schedule="every 60s",
            timezone="UTC",
            tick=now + 60 * SECOND,
            next_tick=None,
        )
        assert stray is None
    new.run_once(now=now + 600 * SECOND)
    fired = ticks(url)
    assert fired == Schedule("*/5 * * * *").ticks_between(now, now + 600 * SECOND)
    assert len(fired) == 2
    # A time-zone change is a change too: it starts afresh from the database's
    # now (not from the pinned `now` of the old definition, which may lie ahead).
    before = jq.backend.db_now()
    berlin = service(app(url, cron="*/5 * * * *", timezone="Europe/Berlin", task="sync"))
    berlin.run_once(now=now + 600 * SECOND)
    (row,) = jq.periodic_list()
    assert row.timezone == "Europe/Berlin"
    assert row.since_at >= before and row.since_at != now  # no catch-up of the old ticks
    new.run_once(now=now + 1200 * SECOND)
    assert len(ticks(url)) == 2


def test_options_follow_the_latest_start_and_the_row_is_the_template(jq):
    url = jq.url.url
    jq.periodic(every=60, task="sync", queue="a", priority=1, args={"v": 1})
    old = service(jq)
    now = aligned(jq.backend.db_now(), 60, 30)
    old.run_once(now=now)
    service(app(url, every=60, task="sync", queue="b", priority=2, args={"v": 2})).run_once(now=now)
    # Same schedule: the old worker still fires it, with the stored template.
    old.run_once(now=now + 60 * SECOND)
    rows = sql(url, "SELECT queue, priority, args FROM jobkeeper_jobs")
    decoded = [(q, p, a if isinstance(a, dict) else json.loads(a)) for q, p, a in rows]
    assert decoded == [("b", 2, {"v": 2})]


def test_a_vanished_row_is_stored_again_from_now(jq):
    jq.periodic(every=1, task="beat")
    worker = service(jq)
    now = jq.backend.db_now()
    worker.run_once(now=now)
    sql(jq.url.url, "DELETE FROM jobkeeper_periodic")
    worker.run_once(now=now + 5 * SECOND)
    (row,) = jq.periodic_list()
    assert row.name == "beat" and row.last_tick_at is None
    worker.run_once(now=now + 7 * SECOND)
    # Owed from the re-creation on (the database's now() then).
    assert ticks(jq.url.url) == Schedule(every=1).ticks_between(row.since_at, now + 7 * SECOND)


def test_thirty_periodics_all_fire(jq):
    for i in range(30):
        jq.periodic(every=1, task=f"t{i:02}")
    worker = service(jq)
    now = jq.backend.db_now()
    worker.run_once(now=now)
    worker.run_once(now=now + 2.5 * SECOND)
    counts = per_task(jq.url.url)
    assert sorted(counts) == [f"t{i:02}" for i in range(30)]
    # Each periodic owes ticks from its own registration (the database's
    # now() then): thirty registrations may straddle a second, so some owe
    # one tick more than others (a clean-clone run saw 13 at 3, 17 at 2).
    assert min(counts.values()) >= 2 and max(counts.values()) - min(counts.values()) <= 1


@pytest.mark.parametrize("racers", [8])
def test_twin_tick_statements_insert_one_job(jq, racers):
    jq.periodic(every=1, task="beat")
    service(jq).run_once()
    (row,) = jq.periodic_list()
    backends = [jq.backend.dedicated() for _ in range(racers)]
    try:
        for round_ in range(1, 6):
            tick = Schedule(every=1).next_after(row.since_at) + round_ * SECOND
            barrier = threading.Barrier(racers)
            results: list[int | None] = []

            def race(backend, tick=tick, barrier=barrier, results=results):
                barrier.wait()
                results.append(
                    backend.periodic_enqueue_tick(
                        name="beat",
                        schedule="every 1s",
                        timezone="UTC",
                        tick=tick,
                        next_tick=tick + SECOND,
                    )
                )

            assert run_threads(race, [(b,) for b in backends], timeout=30) == []
            assert len([r for r in results if r is not None]) == 1, results
            assert ticks(jq.url.url)[-1] == tick
        assert len(ticks(jq.url.url)) == 5
    finally:
        for backend in backends:
            backend.close()


def _last_seen_40_s_ago(jq) -> tuple[datetime, datetime, PeriodicEnqueuer]:
    """A 2 s periodic (catch_up=0) whose worker last passed, ticked and
    refreshed 40 s before the returned ``now``; returns (now, then, its
    enqueuer), which judges missed ticks after 0.5 s.
    """
    jq.periodic(every=2, task="report", catch_up=0)
    now = aligned(jq.backend.db_now(), 60, 30)
    before = now - 40 * SECOND
    first = service(jq, judge_after=0.5)
    first.run_once(now=before)
    fabricate(jq.url.url, "report", since_at=before, last_tick_at=before, seen_at=before)
    return now, before, first


def test_a_new_worker_leaves_an_outages_ticks_to_a_worker_cut_off_by_it(jq, caplog):
    # helper-82: the database down for 30 s under a running worker; a worker
    # started right after it came back found seen_at 30 s old, judged the
    # outage's ticks missed (catch_up=0) and skipped them, before the worker
    # that had run through the outage reconnected and could enqueue them.
    now, before, running = _last_seen_40_s_ago(jq)  # running: since before the outage
    returning = service(jq, judge_after=0.5)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.periodic"):
        returning.run_once(now=now)  # started right after it
        assert ticks(jq.url.url) == [] and returning.skipped == 0
        assert returning.interval <= 0.5
        running.run_once(now=now)  # back: the ticks came due while it ran
        expected = Schedule(every=2).ticks_between(before + SECOND, now)
        assert ticks(jq.url.url) == expected
        time.sleep(0.5)
        returning.run_once(now=now)
    assert ticks(jq.url.url) == expected and returning.skipped == 0
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_missed_ticks_are_judged_once_the_database_was_reached_long_enough(jq, caplog):
    now, _, _ = _last_seen_40_s_ago(jq)  # by a worker that died then
    returning = service(jq, judge_after=0.5)
    returning.run_once(now=now)
    assert returning.skipped == 0
    time.sleep(0.5)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.periodic"):
        returning.run_once(now=now)
    assert returning.skipped == 19 and ticks(jq.url.url) == [now]  # now's is not missed
    assert any("missed tick" in r.getMessage() for r in caplog.records)
