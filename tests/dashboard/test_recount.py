"""queue_counts above its cap: a recount, the rows finished since, and a
thread that recounts (both backends). Break-test 19 (helper-62) found the
estimates these replace dropping a queue whose finished jobs were all older
than the newest 100,001, and 2-20 times off.
"""

from __future__ import annotations

import logging
import threading
import time

from jobkeeper import JobQueue
from jobkeeper.backends import cockpit
from jobkeeper.errors import DatabaseUnavailable
from jobkeeper.models import Completion, Failure
from jobkeeper.outcomes import claim_of


def finish(jq: JobQueue, queue: str, n: int, *, ago: float = 0.0) -> None:
    """Complete ``n`` new jobs of ``queue``, their finished_at ``ago`` seconds back."""
    jobs = jq.enqueue_many([("t", {"i": i}, {"queue": queue}) for i in range(n)])
    claimed = jq.backend.job_claim(worker_id="w1", queue=queue, limit=n)
    assert len(claimed) == n
    jq.backend.job_complete_many(
        completions=[Completion(claim_of(j), None) for j in claimed], delete=False
    )
    if ago:
        ids = [job.id for job in jobs]
        if jq.backend.name == "postgresql":
            jq.backend._fetch_raw(
                "UPDATE jobkeeper_jobs SET finished_at = finished_at - make_interval(secs => %s)"
                " WHERE id = ANY(%s)",
                (ago, ids),
            )
        else:
            conn = jq.backend._conn()
            conn.executemany(
                "UPDATE jobkeeper_jobs SET finished_at = finished_at - ? WHERE id = ?",
                [(ago, i) for i in ids],
            )


def bury(jq: JobQueue, queue: str, n: int) -> None:
    """Make ``n`` dead letters of ``queue``."""
    jq.enqueue_many([("t", {"i": i}, {"queue": queue, "max_attempts": 1}) for i in range(n)])
    claimed = jq.backend.job_claim(worker_id="w1", queue=queue, limit=n)
    jq.backend.job_fail_many(
        failures=[Failure(claim_of(j), "dead", '{"error": "boom"}') for j in claimed]
    )


def delete_finished(jq: JobQueue, queue: str, n: int) -> None:
    """Delete ``n`` finished jobs of ``queue``, as retention pruning does."""
    if jq.backend.name == "postgresql":
        jq.backend._fetch_raw(
            "DELETE FROM jobkeeper_jobs WHERE id IN (SELECT id FROM jobkeeper_jobs"
            " WHERE queue = %s AND status = 'completed' LIMIT %s)",
            (queue, n),
        )
    else:
        jq.backend._conn().execute(
            "DELETE FROM jobkeeper_jobs WHERE id IN (SELECT id FROM jobkeeper_jobs"
            " WHERE queue = ? AND status = 'completed' LIMIT ?)",
            (queue, n),
        )


def completed(jq: JobQueue, exact_below: int) -> dict[str, int]:
    counts = jq.queue_counts(exact_below=exact_below)
    assert "completed" in counts.estimated
    return {q: per["completed"] for q, per in counts.counts.items() if "completed" in per}


def wait_for_recounts() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("jobkeeper-recount-"):
            thread.join(timeout=30)
            assert not thread.is_alive()


def make_due(jq: JobQueue, by: float = cockpit.RECOUNT_EVERY + 1) -> None:
    """Age the backend's tallies by ``by`` seconds (default: past RECOUNT_EVERY)."""
    kept = jq.backend.__dict__["_tallies"]
    for kind, tally in list(kept.tallies.items()):
        kept.tallies[kind] = cockpit.Tally(tally.counts, tally.upto, tally.started - by, tally.took)


def test_a_queue_whose_finished_jobs_are_all_old_is_counted(jq):
    # helper-62's shape, small: the newest rows past the cap are all `bulk`;
    # `old_archive`'s finished a month ago. Both exact, and the tally's rows
    # (finished before the recount's margin) meet the recent ones.
    finish(jq, "old_archive", 50, ago=30 * 86400)
    finish(jq, "bulk", 80, ago=3600)
    finish(jq, "bulk", 40)
    assert completed(jq, exact_below=50) == {"old_archive": 50, "bulk": 120}
    tally = jq.backend.__dict__["_tallies"].tallies["finished"]
    assert tally.counts == {"old_archive": {"completed": 50}, "bulk": {"completed": 80}}


def test_rows_finished_after_the_recount_are_added_at_each_read(jq):
    finish(jq, "q", 40, ago=60)
    assert completed(jq, exact_below=10) == {"q": 40}
    finish(jq, "q", 7)
    finish(jq, "other", 3)
    assert completed(jq, exact_below=10) == {"q": 47, "other": 3}
    wait_for_recounts()
    # Not due yet: no thread started, the first tally still answers.
    assert jq.backend.__dict__["_tallies"].tallies["finished"].counts == {"q": {"completed": 40}}


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
