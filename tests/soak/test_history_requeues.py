"""The soak checker's rules for claim numbers (fences) and requeues out of the
dead letters, fed crafted histories (test_history.py's good history plus two
requeued jobs): each rule, removed, lets its bad history through.
"""

from __future__ import annotations

from benchmarks.soak.history import Ack, Expected, History, Requeue, Row, check

from .test_history import W1, W2, W3, W4, failed_error, good_history, kinds, result, row, run


def requeue_history() -> History:
    """Job 10 (always fails, 2 attempts) dead at 101.11 under fence 2,
    requeued at 102 (migration 18: fence 2 goes on), dead again at 104.11
    under fence 4. Job 11 (flaky, 1 attempt) dead at 100.11 under fence 1,
    requeued by ``retry`` at 102 (fence 1 goes on), claimed by W4 under
    fence 2 and given back free (W4 was stopped), run again by W1 at the
    same attempt number under fence 3, completed.
    """
    history = good_history()
    history.enqueued[10] = Expected(10, "fail")
    history.enqueued[11] = Expected(11, "flaky")
    history.events += [
        *run(10, 1, W1, 100.0, 100.1, "error", fence=1),
        *run(10, 2, W2, 101.0, 101.1, "error", fence=2),
        *run(10, 1, W1, 103.0, 103.1, "error", fence=3),
        *run(10, 2, W2, 104.0, 104.1, "error", fence=4),
        *run(11, 1, W1, 100.0, 100.1, "error", fence=1),
        *run(11, 1, W1, 103.0, 103.1, "ok", fence=3),
    ]
    errors10 = [failed_error(a, t) for a, t in ((1, 100.11), (2, 101.11), (1, 103.11), (2, 104.11))]
    history.rows += [
        Row(10, "dead", 2, 2, 10, None, errors10, 104.11, fence=4),
        Row(11, "completed", 1, 1, 11, result(11, W1, 1, 3), [failed_error(1, 100.11)], 103.11),
    ]
    row(history, 11).fence = 3
    history.acks = [
        *(history.acks or []),
        Ack(10, "retryable", W1, 1, 100.11, fence=1),
        Ack(10, "removed", W2, 2, 101.11, fence=2),
        Ack(10, "retryable", W1, 1, 103.11, fence=3),
        Ack(10, "removed", W2, 2, 104.11, fence=4),
        Ack(11, "removed", W1, 1, 100.11, fence=1),
        Ack(11, "available", W4, 1, 103.0, fence=2),
        Ack(11, "completed", W1, 1, 103.11, fence=3),
    ]
    history.requeues = [
        Requeue(10, "api_requeue_dead", 102.0, 102.05),
        Requeue(11, "api_retry", 102.0, 102.05),
    ]
    return history


def test_a_requeued_history_passes():
    report = check(requeue_history())
    assert report.violations == []
    assert report.stats["requeues_confirmed"] == 2
    assert report.stats["requeued_jobs"] == 2


def test_a_second_life_reusing_the_first_claims_fence_is_caught():
    # The bug of schema 17: the requeue set the fence back to 0, so the
    # same worker's attempt 1 came back under fence 1, the first life's.
    history = requeue_history()
    history.events = [e for e in history.events if (e.job, e.t) != (11, 103.0)]
    history.events = [e for e in history.events if (e.job, e.t) != (11, 103.1)]
    history.events += run(11, 1, W1, 103.0, 103.1, "ok", fence=1)
    row(history, 11).result = result(11, W1, 1, 1)
    row(history, 11).fence = 1
    history.acks = [a for a in history.acks or [] if (a.job, a.new_status) != (11, "completed")]
    history.acks.append(Ack(11, "completed", W1, 1, 103.11, fence=1))
    assert "fence_reused" in kinds(check(history))


def test_a_fence_that_starts_again_after_a_requeue_is_caught():
    # Job 10's second life on other workers, numbered from 1 again.
    history = requeue_history()
    history.events = [e for e in history.events if not (e.job == 10 and e.t >= 103.0)]
    history.events += run(10, 1, W3, 103.0, 103.1, "error", fence=1)
    history.events += run(10, 2, W4, 104.0, 104.1, "error", fence=2)
    row(history, 10).fence = 2
    found = kinds(check(history))
    assert "fence_not_increasing" in found
    assert "fence_reused" in found


def test_a_lower_fence_starting_late_is_caught_unless_its_claim_was_rescued():
    history = requeue_history()
    # W4, resumed, starts the claim (fence 2) it had lost: a stale start.
    history.events += run(11, 1, W4, 103.5, 103.6, "error", fence=2)
    report = check(history)
    assert report.violations == []
    assert report.stats["started_after_rescue"] == 1
    # Without the record of its loss, a claim numbered below one that ran.
    history.acks = [a for a in history.acks or [] if a.new_status != "available"]
    assert "fence_not_increasing" in kinds(check(history))


def test_an_execution_above_the_rows_fence_is_caught():
    history = requeue_history()
    row(history, 10).fence = 3
    assert "final_row_mismatch" in kinds(check(history))


def test_a_completion_that_is_not_the_last_claims_is_caught():
    history = requeue_history()
    row(history, 11).fence = 4
    assert "final_row_mismatch" in kinds(check(history))


def test_a_dead_row_whose_last_claim_ended_ok_is_caught():
    history = requeue_history()
    history.events = [e for e in history.events if (e.job, e.t) != (10, 104.1)]
    history.events += [e for e in run(10, 2, W2, 104.0, 104.1, "ok", fence=4) if e.kind == "E"]
    assert "final_row_mismatch" in kinds(check(history))


def test_a_confirmed_requeue_never_followed_is_caught_a_maybe_one_is_not():
    history = requeue_history()
    # A third requeue of job 10 said it moved it, but nothing ran after it
    # and the job's end is the one before.
    history.requeues.append(Requeue(10, "cli_dead_requeue", 105.0, 105.5))
    found = kinds(check(history))
    assert "requeue_lost" in found
    assert "dead_letter_accounting" in found
    history.requeues[-1] = Requeue(10, "cli_dead_requeue", 105.0, 105.5, confirmed=False)
    assert check(history).violations == []


def test_a_job_out_of_the_dead_letters_without_a_requeue_is_caught():
    history = requeue_history()
    history.requeues = [r for r in history.requeues if r.job != 11]
    assert kinds(check(history)) == {"dead_letter_accounting"}


def test_a_run_while_in_the_dead_letters_is_caught():
    history = requeue_history()
    history.events += run(10, 1, W3, 101.5, 101.6, "error", fence=3)
    assert "ran_after_finish" in kinds(check(history))


def test_a_claim_after_the_completing_one_is_caught():
    # Without the row's fence: a claim numbered above the completion's ran.
    history = requeue_history()
    row(history, 11).fence = None
    history.events += run(11, 2, W2, 103.12, 103.13, "error", fence=4)
    assert "final_row_mismatch" in kinds(check(history))


def test_a_claim_logged_under_fence_0_in_a_real_run_is_caught():
    # A fence of 0 reads as "not recorded" in hand-made histories, so a bug
    # that numbered a claim 0 (a requeue writing -1) passed every other
    # fence check (helper-108's reading). Where the row's fence was read, a
    # run under 0 is flagged.
    history = requeue_history()
    history.events = [e for e in history.events if not (e.job == 10 and e.t >= 103.0)]
    history.events += run(10, 1, W1, 103.0, 103.1, "error", fence=0)
    history.events += run(10, 2, W2, 104.0, 104.1, "error", fence=1)
    row(history, 10).fence = 1
    assert "fence_missing" in kinds(check(history))
    assert check(requeue_history()).violations == []
