"""queue_counts above its cap: a recount, the rows finished since, and a
thread that recounts (both backends). Break-test 19 (helper-62) found the
estimates these replace dropping a queue whose finished jobs were all older
than the newest 100,001, and 2-20 times off.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from jobkeeper import JobQueue
from jobkeeper.backends import cockpit
from jobkeeper.dashboard.metrics import render_metrics
from jobkeeper.errors import DatabaseUnavailable
from jobkeeper.models import Failure
from jobkeeper.outcomes import claim_of

from .seed import delete_finished, finish


def bury(jq: JobQueue, queue: str, n: int) -> None:
    """Make ``n`` dead letters of ``queue``."""
    jq.enqueue_many([("t", {"i": i}, {"queue": queue, "max_attempts": 1}) for i in range(n)])
    claimed = jq.backend.job_claim(worker_id="w1", queue=queue, limit=n)
    jq.backend.job_fail_many(
        failures=[Failure(claim_of(j), "dead", '{"error": "boom"}') for j in claimed]
    )


def completed(jq: JobQueue, exact_below: int) -> dict[str, int]:
    counts = jq.queue_counts(exact_below=exact_below)
    assert "completed" in counts.estimated
    return {q: per["completed"] for q, per in counts.counts.items() if "completed" in per}


def fail_recounts(jq: JobQueue, monkeypatch) -> dict[str, bool]:
    """Make the recount of finished rows fail as a statement_timeout does,
    while the returned switch's ``"on"`` is True.
    """
    real_fetch = jq.backend._fetch
    failing = {"on": True}

    def fetch(name, params=None, **kwargs):
        if name == "queue_counts_finished_upto" and failing["on"]:
            raise DatabaseUnavailable("canceling statement due to statement timeout")
        return real_fetch(name, params, **kwargs)

    monkeypatch.setattr(jq.backend, "_fetch", fetch)
    return failing


def wait_for_recounts() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("jobkeeper-recount-"):
            thread.join(timeout=30)
            assert not thread.is_alive()


def make_due(jq: JobQueue, by: float = cockpit.RECOUNT_EVERY + 1) -> None:
    """Age the backend's tallies by ``by`` seconds (default: past RECOUNT_EVERY)."""
    kept = jq.backend._tallies()
    for kind, tally in list(kept.tallies.items()):
        kept.tallies[kind] = dataclasses.replace(
            tally, counted=tally.counted - by, tried=tally.tried - by
        )


def test_a_queue_whose_finished_jobs_are_all_old_is_counted(jq):
    # helper-62's shape, small: the newest rows past the cap are all `bulk`;
    # `old_archive`'s finished a month ago. Both exact, and the tally's rows
    # (finished before the recount's margin) meet the recent ones.
    finish(jq, "old_archive", 50, ago=30 * 86400)
    finish(jq, "bulk", 80, ago=3600)
    finish(jq, "bulk", 40)
    assert completed(jq, exact_below=50) == {"old_archive": 50, "bulk": 120}
    tally = jq.backend._tallies().tallies["finished"]
    assert tally.counts == {"old_archive": {"completed": 50}, "bulk": {"completed": 80}}


def test_rows_finished_after_the_recount_are_added_at_each_read(jq):
    finish(jq, "q", 40, ago=60)
    assert completed(jq, exact_below=10) == {"q": 40}
    finish(jq, "q", 7)
    finish(jq, "other", 3)
    assert completed(jq, exact_below=10) == {"q": 47, "other": 3}
    wait_for_recounts()
    # Not due yet: no thread started, the first tally still answers.
    assert jq.backend._tallies().tallies["finished"].counts == {"q": {"completed": 40}}


def test_a_due_recount_runs_in_a_thread_and_shows_pruned_rows(jq):
    finish(jq, "q", 40, ago=60)
    assert completed(jq, exact_below=10) == {"q": 40}
    delete_finished(jq, "q", 15)
    assert completed(jq, exact_below=10) == {"q": 40}  # the tally is not due
    make_due(jq)
    # The read that finds it due answers from the last tally and starts the
    # recount; the reads after it see what the recount found.
    assert completed(jq, exact_below=10) == {"q": 40}
    wait_for_recounts()
    assert completed(jq, exact_below=10) == {"q": 25}


def test_more_rows_since_the_recount_than_the_cap_start_one(jq, monkeypatch):
    # No margin: the recount started now counts the rows just finished.
    monkeypatch.setattr(cockpit, "RECOUNT_MARGIN", 0.0)
    finish(jq, "q", 20, ago=60)
    assert completed(jq, exact_below=10) == {"q": 20}
    finish(jq, "q", 30)
    # 30 since the tally, read up to the cap of 11: an undercount that
    # starts a recount as soon as the spacing allows (here 20 times a count
    # of a few ms), not after RECOUNT_EVERY.
    make_due(jq, by=5.0)
    assert completed(jq, exact_below=10) == {"q": 31}
    wait_for_recounts()
    assert completed(jq, exact_below=10) == {"q": 50}


def test_dead_letters_above_the_cap_come_from_a_recount(jq):
    bury(jq, "a", 12)
    bury(jq, "b", 5)
    counts = jq.queue_counts(exact_below=10)
    assert "dead" in counts.estimated and "completed" not in counts.estimated
    assert counts.lower_bound == frozenset()  # counted, not a lower bound
    assert counts.counts["a"]["dead"] == 12 and counts.counts["b"]["dead"] == 5
    bury(jq, "b", 4)
    assert jq.queue_counts(exact_below=10).counts["b"]["dead"] == 5  # until the next recount
    make_due(jq)
    jq.queue_counts(exact_below=10)
    wait_for_recounts()
    assert jq.queue_counts(exact_below=10).counts["b"]["dead"] == 9
    assert jq.queue_counts(exact_below=100).counts["b"]["dead"] == 9


def test_a_failed_recount_keeps_the_last_and_is_retried(jq, caplog):
    finish(jq, "q", 30, ago=60)
    assert completed(jq, exact_below=10) == {"q": 30}
    delete_finished(jq, "q", 10)
    backend = jq.backend
    real_fetch = backend._fetch
    failing = {"on": True}

    def fetch(name, params=None, **kwargs):
        if name == "queue_counts_finished_upto" and failing["on"]:
            raise DatabaseUnavailable("server went away")
        return real_fetch(name, params, **kwargs)

    backend._fetch = fetch
    try:
        make_due(jq)
        with caplog.at_level(logging.WARNING, logger="jobkeeper.cockpit"):
            assert completed(jq, exact_below=10) == {"q": 30}
            wait_for_recounts()
        assert "recount of the finished jobs failed: server went away" in caplog.text
        # The failure counts as a recount for its spacing: not retried at once.
        assert completed(jq, exact_below=10) == {"q": 30}
        wait_for_recounts()
        failing["on"] = False
        make_due(jq)
        completed(jq, exact_below=10)
        wait_for_recounts()
        assert completed(jq, exact_below=10) == {"q": 20}
    finally:
        del backend._fetch


def test_callers_that_come_together_share_the_first_count(jq):
    finish(jq, "q", 30, ago=60)
    backend = jq.backend
    real_fetch = backend._fetch
    recounts = []

    def fetch(name, params=None, **kwargs):
        if name == "queue_counts_finished_upto":
            recounts.append(name)
            time.sleep(0.2)
        return real_fetch(name, params, **kwargs)

    backend._fetch = fetch
    try:
        results = []
        threads = [
            threading.Thread(target=lambda: results.append(completed(jq, exact_below=10)))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        del backend._fetch
    assert results == [{"q": 30}] * 4
    assert len(recounts) == 1


def test_the_recount_thread_lets_go_of_its_sqlite_connection(sqlite_url):
    # PostgreSQL's threads borrow pooled connections: nothing to let go of.
    jq = JobQueue(sqlite_url)
    jq.migrate()
    finish(jq, "q", 30, ago=60)
    completed(jq, exact_below=10)
    before = len(jq.backend._threads)
    for _ in range(3):
        make_due(jq)
        completed(jq, exact_below=10)
        wait_for_recounts()
    assert len(jq.backend._threads) == before
    jq.close()


def fill_finished(jq: JobQueue, queue: str, n: int, *, ago: float) -> None:
    """``n`` completed jobs of ``queue`` finished ``ago`` seconds back, in one
    statement (the API would take a minute for 100,000).
    """
    if jq.backend.name == "postgresql":
        jq.backend._fetch_raw(
            "INSERT INTO jobkeeper_jobs (queue, task, args, status, attempt, finished_at)"
            " SELECT %s, 't', '{}', 'completed', 1, now() - make_interval(secs => %s)"
            " FROM generate_series(1, %s)",
            (queue, ago, n),
        )
    else:
        conn = jq.backend._conn()
        conn.execute(
            "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < ?)"
            " INSERT INTO jobkeeper_jobs (queue, task, args, status, attempt, finished_at,"
            " scheduled_at, created_at) SELECT ?, 't', '{}', 'completed', 1, ?, ?, ? FROM g",
            (n, queue, time.time() - ago, time.time(), time.time()),
        )


def spy_recounts(jq: JobQueue, monkeypatch) -> list[str]:
    """The names of the recount queries run from now on by any backend of
    ``jq``'s kind (the CLI opens its own).
    """
    seen: list[str] = []
    cls = type(jq.backend)
    real_fetch = cls._fetch

    def fetch(self, name, params=None, **kwargs):
        if name in ("queue_counts_finished_upto", "queue_counts_dead_all"):
            seen.append(name)
        return real_fetch(self, name, params, **kwargs)

    monkeypatch.setattr(cls, "_fetch", fetch)
    return seen


def test_pause_and_the_queues_table_count_no_finished_row(jq, db_url, monkeypatch, capsys):
    # helper-64: pause, resume and `queues list` counted every finished row
    # in a new process (2.1 s at 8M rows), and failed where statement_timeout
    # was shorter, jq.pause() after its change had committed.
    from support.cli import Cli

    fill_finished(jq, "old", 100_000, ago=86400)
    fill_finished(jq, "q", 5, ago=60)
    seen = spy_recounts(jq, monkeypatch)
    info = jq.pause("q")
    assert info.paused and info.estimated == ("cancelled", "completed")
    assert info.lower_bound == ("cancelled", "completed")
    assert info.counts["completed"] == 5  # the newest 100,001 hold all of q's
    assert jq.resume("q").estimated == ("cancelled", "completed")
    # The newest 100,001 rows: q's 5 and 99,996 of old's.
    lower = {q.name: q.counts["completed"] for q in jq.queues(recount=False)}
    assert lower == {"old": 99_996, "q": 5}
    assert seen == []
    counted = jq.queues()
    assert {q.name: q.counts["completed"] for q in counted} == {"old": 100_000, "q": 5}
    assert {q.lower_bound for q in counted} == {()}
    assert seen == ["queue_counts_finished_upto"]
    cli = Cli(db_url, capsys)
    assert cli("queues", "pause", "q")[0] == 0
    code, out, _ = cli("queues", "list")
    assert code == 0 and "paused" in out
    assert seen == ["queue_counts_finished_upto"]  # neither command recounted
    listed = cli.json("queues", "list")[0]
    assert listed["counts"]["completed"] == 100_000 and listed["lower_bound"] == []
    assert seen == ["queue_counts_finished_upto"] * 2  # --json did


def test_a_first_recount_that_fails_falls_back_to_the_newest_rows(jq, monkeypatch, caplog):
    finish(jq, "old", 20, ago=86400)
    finish(jq, "q", 15, ago=60)
    failing = fail_recounts(jq, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.cockpit"):
        counts = jq.queue_counts(exact_below=10)
    assert "recount of the finished jobs failed" in caplog.text
    # The newest 11 rows, all of q: a lower bound, named as not exact.
    assert counts.counts == {"q": {"completed": 11}}
    assert counts.estimated == {"completed", "cancelled"}
    assert counts.lower_bound == {"completed", "cancelled"}
    caplog.clear()
    assert jq.queue_counts(exact_below=10).counts == {"q": {"completed": 11}}
    assert caplog.text == ""  # not tried again at every read
    body, _ = render_metrics(jq, exact_below=10)
    assert 'jobkeeper_jobs_lower_bound{status="completed"} 1.0' in body.decode()
    failing["on"] = False
    make_due(jq)
    jq.queue_counts(exact_below=10)
    wait_for_recounts()
    assert completed(jq, exact_below=10) == {"old": 20, "q": 15}
    recounted = jq.queue_counts(exact_below=10)
    assert recounted.estimated == {"completed", "cancelled"} and not recounted.lower_bound
    body, _ = render_metrics(jq, exact_below=10)
    assert 'jobkeeper_jobs_lower_bound{status="completed"} 0.0' in body.decode()


def test_a_tally_left_alone_too_long_is_recounted_before_it_is_shown(jq):
    # helper-64: after a quiet spell the first read answered from a count of
    # any age (its recount ran behind it).
    finish(jq, "q", 40, ago=60)
    assert completed(jq, exact_below=10) == {"q": 40}
    delete_finished(jq, "q", 15)
    make_due(jq, by=cockpit.RECOUNT_EXPIRES * cockpit.RECOUNT_EVERY + 1)
    assert completed(jq, exact_below=10) == {"q": 25}


def test_a_dip_under_the_cap_forgets_the_tally(jq):
    # helper-64: purged below the cap and risen again past it, the counts
    # came from the tally taken before the purge.
    bury(jq, "a", 12)
    assert jq.queue_counts(exact_below=10).counts["a"]["dead"] == 12
    jq.purge_dead()
    assert "a" not in jq.queue_counts(exact_below=10).counts
    bury(jq, "b", 12)
    make_due(jq, by=cockpit.RECOUNT_EVERY - 5)
    counts = jq.queue_counts(exact_below=10)
    assert "a" not in counts.counts and counts.counts["b"]["dead"] == 12


def test_a_recount_thread_that_cannot_start_is_tried_again(jq, monkeypatch, caplog):
    # helper-64: the running mark was set before the thread started, so one
    # refused start froze the tally for the life of the process.
    finish(jq, "q", 40, ago=60)
    assert completed(jq, exact_below=10) == {"q": 40}
    delete_finished(jq, "q", 15)
    real_start = threading.Thread.start
    refused = []

    def start(thread):
        if thread.name.startswith("jobkeeper-recount-") and not refused:
            refused.append(thread.name)
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    make_due(jq)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.cockpit"):
        assert completed(jq, exact_below=10) == {"q": 40}
    assert refused and "could not start the recount" in caplog.text
    make_due(jq)
    completed(jq, exact_below=10)
    wait_for_recounts()
    assert completed(jq, exact_below=10) == {"q": 25}


def test_a_recount_that_started_before_a_dip_is_not_kept(jq, monkeypatch):
    # helper-65: a thread counting while the rows fell under the cap stored
    # its count after the read that forgot the tally: 40 + 10 shown for 15.
    finish(jq, "q", 40, ago=60)
    assert completed(jq, exact_below=10) == {"q": 40}
    real_fetch = jq.backend._fetch
    counted, release = threading.Event(), threading.Event()

    def fetch(name, params=None, **kwargs):
        rows = real_fetch(name, params, **kwargs)
        if name == "queue_counts_finished_upto" and threading.current_thread().name.startswith(
            "jobkeeper-recount-"
        ):
            counted.set()
            release.wait(10)
        return rows

    monkeypatch.setattr(jq.backend, "_fetch", fetch)
    make_due(jq)
    completed(jq, exact_below=10)
    assert counted.wait(10)  # the thread has counted the 40
    delete_finished(jq, "q", 35)
    counts = jq.queue_counts(exact_below=10)
    assert counts.counts["q"]["completed"] == 5 and counts.estimated == frozenset()
    release.set()
    wait_for_recounts()
    finish(jq, "q", 10)
    assert completed(jq, exact_below=10) == {"q": 15}


def test_a_failing_recount_is_tried_once_an_interval_even_past_the_cap(jq, monkeypatch, caplog):
    # helper-65: after a good count, a failing one kept its `upto`, so more
    # than the cap finished since it asked for a recount at nearly every
    # read (39 tries in 10 s).
    finish(jq, "q", 20, ago=60)
    assert completed(jq, exact_below=10) == {"q": 20}
    real_fetch = jq.backend._fetch
    tries = []

    def fetch(name, params=None, **kwargs):
        if name == "queue_counts_finished_upto":
            tries.append(name)
            raise DatabaseUnavailable("canceling statement due to statement timeout")
        return real_fetch(name, params, **kwargs)

    monkeypatch.setattr(jq.backend, "_fetch", fetch)
    finish(jq, "q", 30)
    make_due(jq)
    for _ in range(5):
        assert completed(jq, exact_below=10) == {"q": 31}
        wait_for_recounts()
        time.sleep(0.1)  # past the spacing of 20 counts of a few ms
    assert len(tries) == 1


def test_counts_kept_while_no_thread_starts_expire_and_are_counted_in_the_caller(
    jq, monkeypatch, caplog
):
    # helper-65: a refused start reset the tally's clock, so while starts
    # kept failing it never expired: 40 shown for 25 for good.
    finish(jq, "q", 40, ago=60)
    assert completed(jq, exact_below=10) == {"q": 40}
    delete_finished(jq, "q", 15)
    real_start = threading.Thread.start

    def start(thread):
        if thread.name.startswith("jobkeeper-recount-"):
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    expiry = cockpit.RECOUNT_EXPIRES * cockpit.RECOUNT_EVERY
    make_due(jq, by=expiry - 10)
    with caplog.at_level(logging.WARNING, logger="jobkeeper.cockpit"):
        assert completed(jq, exact_below=10) == {"q": 40}  # a start refused just now
    assert "could not start the recount" in caplog.text
    make_due(jq, by=20)  # the counts are past their expiry, the refusal is not
    assert completed(jq, exact_below=10) == {"q": 25}


def test_the_overview_tells_a_lower_bound_from_a_recount(jq, monkeypatch):
    # Before, both were marked "≈" and a failed recount's lower bound (0 for
    # a queue with only old rows) looked like a count.
    from starlette.testclient import TestClient

    from jobkeeper.dashboard import create_app

    finish(jq, "old", 20, ago=86400)
    finish(jq, "q", 15, ago=60)
    real_counts = jq.queue_counts
    failing = fail_recounts(jq, monkeypatch)
    monkeypatch.setattr(jq, "queue_counts", lambda **kw: real_counts(exact_below=10, **kw))
    with TestClient(create_app(jq)) as client:
        html = client.get("/").text
        assert '<a href="/jobs?status=completed&amp;queue=q">≥11</a>' in html
        assert "counting them failed" in html and "≈ more than" not in html
        failing["on"] = False
        make_due(jq)
        client.get("/")
        wait_for_recounts()
        html = client.get("/").text
    assert '<a href="/jobs?status=completed&amp;queue=old">≈20</a>' in html
    assert "≈ more than 100,000 cancelled, completed rows" in html
    assert "counting them failed" not in html
