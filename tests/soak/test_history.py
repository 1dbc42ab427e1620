"""The soak's history checker, fed crafted histories: a good one passes, and
each kind of bad one (lost job, duplicate row, duplicate completion,
overlapping live executions, completion by a non-holder, ...) is caught.
"""

from __future__ import annotations

import copy
import math
import os
from datetime import UTC, datetime

import pytest
from benchmarks.soak.history import (
    Ack,
    Event,
    ExecLog,
    Expected,
    History,
    Row,
    check,
    deaths_by_pid,
    percentile,
    read_exec_logs,
)

W1, W2, W3, W4 = "host:101:aaaa", "host:102:bbbb", "host:103:cccc", "host:104:dddd"
RESCUE_AFTER = 3.0


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lost_error(worker: str, attempt: int, at: float) -> dict:
    return {
        "attempt": attempt,
        "at": iso(at),
        "error": f"worker lost: {worker} sent no heartbeat for more than 3s while running "
        f"attempt {attempt}",
        "traceback": None,
    }


def failed_error(attempt: int, at: float) -> dict:
    return {"attempt": attempt, "at": iso(at), "error": "Injected: fail", "traceback": "..."}


def beats(start: float, stop: float, every: float = 0.5) -> list[float]:
    out, t = [], start
    while t <= stop + 1e-9:
        out.append(round(t, 3))
        t += every
    return out


def run(job, attempt, worker, start, end=None, outcome="ok", fence=0) -> list[Event]:
    events = [Event("S", job, attempt, worker, start, fence=fence)]
    if end is not None:
        events.append(Event("E", job, attempt, worker, end, outcome, fence))
    return events


def result(n, worker, attempt, fence=0) -> dict:
    return {"n": n, "worker": worker, "attempt": attempt, "fence": fence}


def good_history() -> History:
    """Seven jobs: a plain success, a retried failure, a dead letter, a rescue
    after SIGKILL, a rescue from a SIGSTOPped worker that later resumed (an
    overlap the rules allow), a job left pending and a cancelled one.
    """
    events = [
        *run(1, 1, W1, 100.0, 101.0),
        *run(2, 1, W1, 100.0, 100.5, "error"),
        *run(2, 2, W2, 102.0, 102.2),
        *run(3, 1, W2, 100.0, 100.1, "error"),
        *run(3, 2, W1, 101.0, 101.1, "error"),
        *run(4, 1, W3, 100.0),  # W3 SIGKILLed at 100.5
        *run(4, 2, W1, 105.0, 105.1),
        *run(5, 1, W4, 100.0, 110.0),  # W4 SIGSTOPped 100..109, then finished
        *run(5, 2, W1, 105.0, 106.0),
    ]
    rows = [
        Row(1, "completed", 1, 20, 1, result(1, W1, 1), [], 101.01),
        Row(2, "completed", 2, 20, 2, result(2, W2, 2), [failed_error(1, 100.51)], 102.21),
        Row(3, "dead", 2, 2, 3, None, [failed_error(1, 100.11), failed_error(2, 101.11)], 101.11),
        Row(4, "completed", 2, 20, 4, result(4, W1, 2), [lost_error(W3, 1, 104.0)], 105.11),
        Row(5, "completed", 2, 20, 5, result(5, W1, 2), [lost_error(W4, 1, 104.0)], 106.01),
        Row(6, "scheduled", 0, 20, 6),
        Row(7, "cancelled", 0, 20, 7, finished_at=99.0),
    ]
    acks = [
        Ack(1, "completed", W1, 1, 101.01),
        Ack(2, "retryable", W1, 1, 100.51),
        Ack(2, "completed", W2, 2, 102.21),
        Ack(3, "retryable", W2, 1, 100.11),
        Ack(3, "removed", W1, 2, 101.11),
        Ack(4, "retryable", W3, 1, 104.0),
        Ack(4, "completed", W1, 2, 105.11),
        Ack(5, "retryable", W4, 1, 104.0),
        Ack(5, "completed", W1, 2, 106.01),
    ]
    kinds = {1: "ok", 2: "flaky", 3: "fail", 4: "ok", 5: "long", 6: "pending", 7: "cancel"}
    return History(
        rescue_after=RESCUE_AFTER,
        enqueued={i: Expected(i, kind) for i, kind in kinds.items()},
        rows=rows,
        events=events,
        heartbeats={
            W1: beats(95, 115),
            W2: beats(95, 115),
            W3: beats(95, 100.4),
            W4: [*beats(95, 99.8), *beats(109, 115)],
        },
        acks=acks,
        deaths={W3: 100.5},
    )


def kinds(report) -> set[str]:
    return {v.kind for v in report.violations}


def row(history: History, job_id: int) -> Row:
    return next(r for r in history.rows if r.id == job_id)


def test_a_good_history_passes():
    report = check(good_history())
    assert report.ok, report.violations
    assert report.stats["lost"] == 0
    assert report.stats["duplicates"] == 0
    assert report.stats["rescues"] == 2
    assert report.stats["overlaps_justified"] == 1  # job 5: W4 was stopped
    assert report.stats["by_status"] == {
        "cancelled": 1,
        "completed": 4,
        "dead": 1,
        "scheduled": 1,
    }
    assert report.stats["rescue_after_kill_s"] == [pytest.approx(3.5)]
    assert sorted(report.stats["rescue_after_last_heartbeat_s"]) == [
        pytest.approx(4.0),  # W3's last beat 100.0, rescued at 104
        pytest.approx(4.5),  # W4's last beat 99.5, rescued at 104
    ]


def test_the_good_history_passes_without_heartbeats_or_acks():
    history = good_history()
    history.heartbeats = None
    history.acks = None
    assert check(history).ok


def test_a_lost_job_is_caught():
    history = good_history()
    history.rows = [r for r in history.rows if r.id != 1]
    report = check(history)
    assert kinds(report) == {"lost"}
    assert report.stats["lost"] == 1
    assert report.violations[0].job == 1


def test_a_job_in_both_tables_is_caught():
    history = good_history()
    history.rows.append(Row(2, "dead", 2, 20, 2, None, [failed_error(1, 100.51)], 102.3))
    assert "duplicate_row" in kinds(check(history))


def test_a_job_stored_twice_is_caught():
    history = good_history()
    copy_of_1 = copy.deepcopy(row(history, 1))
    copy_of_1.id = 99
    history.rows.append(copy_of_1)
    assert "duplicate_row" in kinds(check(history))


def test_an_ambiguous_enqueue_may_exist_once():
    history = good_history()
    history.ambiguous = {50: "ok"}
    history.rows.append(Row(50, "completed", 1, 20, 50, result(50, W2, 1), [], 103.0))
    history.events += run(50, 1, W2, 102.5, 102.9)
    history.acks.append(Ack(50, "completed", W2, 1, 103.0))
    assert check(history).ok
    second = Row(51, "completed", 1, 20, 50, result(50, W2, 1), [], 103.0)
    history.rows.append(second)
    assert "duplicate_row" in kinds(check(history))


def test_a_row_nobody_enqueued_is_caught():
    history = good_history()
    history.rows.append(Row(77, "completed", 1, 20, 77, None, [], 100.0))
    assert "unknown_row" in kinds(check(history))


def test_a_duplicate_completion_is_caught():
    history = good_history()
    # W1's attempt 1 of job 2 "failed", yet a completion of it was also written.
    history.acks.append(Ack(2, "completed", W1, 1, 100.6))
    report = check(history)
    assert "duplicate_completion" in kinds(report)


def test_a_completion_of_a_job_that_is_not_completed_is_caught():
    history = good_history()
    history.acks.append(Ack(3, "completed", W2, 1, 100.11))
    assert "duplicate_completion" in kinds(check(history))


def test_overlapping_live_executions_are_caught():
    history = good_history()
    # Job 8 ran on W1 and, meanwhile, on W2 without W1 ever losing its claim.
    history.enqueued[8] = Expected(8, "ok")
    history.events += run(8, 1, W1, 100.0, 104.0) + run(8, 2, W2, 102.0, 103.0)
    history.rows.append(Row(8, "completed", 2, 20, 8, result(8, W2, 2), [], 103.01))
    history.acks.append(Ack(8, "completed", W2, 2, 103.01))
    report = check(history)
    assert "overlap" in kinds(report)
    assert report.stats["duplicates"] == 1
    detail = next(v.detail for v in report.violations if v.kind == "overlap")
    assert "never rescued" in detail and "no audited write released its claim" in detail


def test_an_overlap_after_a_live_holders_claim_was_released_names_the_release():
    history = good_history()
    # As above, but W1's attempt 1 went back to available at 101.0 while W1
    # kept heartbeating: a hand-back by the holder itself, or a free return
    # the heartbeats do not justify (the clean-clone soak failure of
    # 2026-12-04 looked like this). The violation says which write it was.
    history.enqueued[8] = Expected(8, "ok")
    history.events += run(8, 1, W1, 100.0, 104.0) + run(8, 1, W2, 102.0, 103.0)
    history.rows.append(Row(8, "completed", 1, 20, 8, result(8, W2, 1), [], 103.01))
    history.acks += [Ack(8, "available", W1, 1, 101.0), Ack(8, "completed", W2, 1, 103.01)]
    detail = next(v.detail for v in check(history).violations if v.kind == "overlap")
    assert "never rescued" in detail
    assert (
        "its claim went available at 101.000, the holder's last heartbeat 0.000s before" in detail
    )


def test_a_rescue_from_a_live_holder_is_caught():
    history = good_history()
    # Job 8's first holder W1 kept heartbeating, but was "rescued" at 101.5.
    history.enqueued[8] = Expected(8, "ok")
    history.events += run(8, 1, W1, 100.0, 104.0) + run(8, 2, W2, 102.0, 103.0)
    history.rows.append(
        Row(8, "completed", 2, 20, 8, result(8, W2, 2), [lost_error(W1, 1, 101.5)], 103.01)
    )
    report = check(history)
    assert {"overlap", "rescued_live_holder"} <= kinds(report)
    assert report.stats["duplicates"] == 1


def test_an_overlap_with_a_dead_holder_is_not_a_duplicate():
    history = good_history()
    # Job 4's first holder W3 never logged an end: it died at 100.5, so the
    # second execution (from 105) does not overlap it.
    assert check(history).stats["duplicates"] == 0
    # Without the death record the open execution overlaps the second one.
    history.deaths = {}
    history.heartbeats[W3] = beats(95, 115)
    report = check(history)
    assert "overlap" in kinds(report)


def test_a_completion_by_a_holder_who_lost_the_claim_is_caught():
    history = good_history()
    # Job 5: the stale W4 (attempt 1, rescued while stopped) wrote the result.
    row(history, 5).result = result(5, W4, 1)
    report = check(history)
    assert "bad_completion" in kinds(report)


def test_a_completion_fenced_on_the_wrong_holder_is_caught():
    history = good_history()
    history.acks = [
        a if (a.job, a.new_status) != (5, "completed") else Ack(5, "completed", W4, 1, 110.0)
        for a in history.acks
    ]
    report = check(history)
    assert "bad_completion" in kinds(report)


def test_a_completion_without_an_ok_execution_is_caught():
    history = good_history()
    history.events = [e for e in history.events if not (e.job == 1 and e.kind == "E")]
    history.deaths[W1] = 101.0
    report = check(history)
    assert "bad_completion" in kinds(report)


def test_a_completion_by_a_rescued_attempt_is_caught():
    history = good_history()
    # Job 4 completed "by" the attempt that was rescued (the fence failed).
    r = row(history, 4)
    r.attempt = 1
    r.result = result(4, W3, 1)
    history.events += [Event("E", 4, 1, W3, 100.4, "ok")]
    history.deaths = {}
    history.acks = None
    report = check(history)
    assert "bad_completion" in kinds(report)


def test_a_job_left_running_is_caught():
    history = good_history()
    r = row(history, 1)
    r.status, r.worker_id, r.result, r.finished_at = "running", W1, None, None
    history.acks = [a for a in history.acks if a.job != 1]
    assert kinds(check(history)) == {"not_terminal"}


def test_a_deliberately_pending_job_that_ran_is_caught():
    history = good_history()
    history.events += run(6, 1, W1, 100.0, 100.1)
    assert "pending_ran" in kinds(check(history))


def test_a_job_that_must_die_but_completed_is_caught():
    history = good_history()
    history.enqueued[1] = Expected(1, "fail")
    assert "wrong_outcome" in kinds(check(history))


W5, W6 = "host:105:eeee", "host:106:ffff"


def crash_budget_history() -> History:
    """Job 8, whose task succeeds, dead after 3 of 20 attempts for its crash
    budget: lost beside others on W3, then in two lone attempts on W5 and W6,
    each of which died under it (the soak's SIGKILLs, as ``faulted`` says).
    """
    history = good_history()
    history.enqueued[8] = Expected(8, "ok")
    history.events += run(8, 1, W3, 100.0) + run(8, 2, W5, 104.5) + run(8, 3, W6, 110.0)
    pinned = [lost_error(W5, 2, 109.5), lost_error(W6, 3, 114.0)]
    for n, entry in enumerate(pinned, 1):
        entry["error"] += f", alone: crashed its worker {n} times (max_crashes=2)"
    history.rows.append(Row(8, "dead", 3, 20, 8, None, [lost_error(W3, 1, 104.0), *pinned], 114.0))
    history.acks += [
        Ack(8, "retryable", W3, 1, 104.0),
        Ack(8, "retryable", W5, 2, 109.5),
        Ack(8, "removed", W6, 3, 114.0),
    ]
    history.heartbeats.update({W5: beats(95, 105.9), W6: beats(95, 110.4)})
    history.deaths.update({W5: 106.0, W6: 110.5})
    history.faulted = {103: [(100.0, math.inf)], 105: [(105.5, math.inf)], 106: [(110.0, math.inf)]}
    return history


def test_an_innocent_job_dead_for_crashes_the_soak_caused_passes():
    report = check(crash_budget_history())
    assert report.ok, report.violations
    assert report.stats["dead_for_faults"] == [8]


def test_an_innocent_job_charged_a_crash_nobody_injected_is_caught():
    history = crash_budget_history()
    # W6 died, but not by the soak's hand: a poison job ran beside the lone attempt.
    del history.faulted[106]
    report = check(history)
    assert kinds(report) == {"wrong_outcome"}
    assert "neither killed, stopped nor cut off" in str(report.violations[0])


def test_an_innocent_job_dead_early_without_pinned_crashes_is_caught():
    history = crash_budget_history()
    r = row(history, 8)
    r.errors = [lost_error(W3, 1, 104.0), lost_error(W5, 2, 109.5), lost_error(W6, 3, 114.0)]
    report = check(history)
    assert kinds(report) == {"wrong_outcome"}
    assert "no crash pinned" in str(report.violations[0])


def test_an_execution_after_the_job_finished_is_caught():
    history = good_history()
    history.events += run(1, 2, W2, 120.0, 120.1)
    assert "ran_after_finish" in kinds(check(history))


def same_worker_reclaim_history() -> History:
    """Job 8: W4 claims it (attempt 1, fence 1) and is SIGSTOPped before its
    start mark is written; the claim is given back free (the attempt not
    spent); W4 resumes, claims it again (attempt 1 again, fence 2) and
    completes it. The claims differ only by their fence.
    """
    history = good_history()
    history.enqueued[8] = Expected(8, "ok")
    history.rows.append(Row(8, "completed", 1, 20, 8, result(8, W4, 1, fence=2), [], 111.01))
    history.events += run(8, 1, W4, 110.0, 111.0, fence=2)
    history.acks += [
        Ack(8, "available", W4, 1, 103.0, fence=1),
        Ack(8, "completed", W4, 1, 111.01, fence=2),
    ]
    return history


def test_a_same_worker_reclaim_after_a_free_return_passes():
    # The CI failure of 2026-12-01: the checker keyed claims by (job,
    # attempt, worker), so the second claim looked rescued.
    assert check(same_worker_reclaim_history()).violations == []


def test_a_completion_by_the_claim_given_back_free_is_caught():
    history = same_worker_reclaim_history()
    history.events += run(8, 1, W4, 100.0, 109.5, fence=1)
    r = row(history, 8)
    r.result = result(8, W4, 1, fence=1)
    history.acks[-1] = Ack(8, "completed", W4, 1, 111.01, fence=1)
    assert "bad_completion" in kinds(check(history))


def test_a_stale_start_of_a_rescued_claim_after_the_finish_is_only_counted():
    # Job 9: W4 passed its start check at 99.7 and was SIGSTOPped before the
    # task's first line; its claim (fence 1) was given back free, W1 ran and
    # completed it (fence 2); W4 resumed at 109 and the task ran late, its
    # ack refused. A paused process cannot be kept from running; the fence
    # keeps its result out: counted, not a violation.
    history = good_history()
    history.enqueued[9] = Expected(9, "ok")
    history.rows.append(Row(9, "completed", 1, 20, 9, result(9, W1, 1, fence=2), [], 104.51))
    history.events += run(9, 1, W1, 104.0, 104.5, fence=2)
    history.events += run(9, 1, W4, 109.1, 109.2, fence=1)
    history.acks += [
        Ack(9, "available", W4, 1, 103.0, fence=1),
        Ack(9, "completed", W1, 1, 104.51, fence=2),
    ]
    report = check(history)
    assert report.violations == []
    assert report.stats["started_after_rescue"] == 1
    # The same late start by a holder whose claim was never taken is not.
    history.acks = [a for a in history.acks if (a.job, a.new_status) != (9, "available")]
    assert "ran_after_finish" in kinds(check(history))


def test_a_phantom_execution_is_caught():
    history = good_history()
    history.events += run(1234, 1, W2, 100.0, 100.1)
    assert "phantom_execution" in kinds(check(history))


def test_a_malformed_log_is_caught():
    history = good_history()
    history.events += [Event("E", 1, 7, W2, 100.0, "ok")]  # end without start
    assert "bad_log" in kinds(check(history))


def test_the_exec_log_round_trips(tmp_path):
    log = ExecLog(tmp_path)
    log.start(1, 1, W1, 1)
    log.end(1, 1, W1, 1, "ok")
    log.start(2, 3, W2, 5)
    (tmp_path / "exec-999-x.log").write_text("S\tnot-a-number\n")
    events, bad = read_exec_logs(tmp_path)
    assert bad == 1
    assert [(e.kind, e.job, e.attempt, e.worker, e.fence, e.outcome) for e in events] == [
        ("S", 1, 1, W1, 1, ""),
        ("E", 1, 1, W1, 1, "ok"),
        ("S", 2, 3, W2, 5, ""),
    ]
    assert os.path.basename(next(tmp_path.glob(f"exec-{os.getpid()}-*.log")))


def test_deaths_are_matched_by_pid_and_time():
    lives = [(101, 0.0, 50.0), (101, 60.0, None), (103, 0.0, 100.5)]
    first_seen = {"host:101:aaaa": 10.0, "host:101:eeee": 70.0, W3: 1.0, W2: 5.0}
    assert deaths_by_pid(first_seen, lives) == {"host:101:aaaa": 50.0, W3: 100.5}


def test_percentile():
    assert percentile([], 99) is None
    assert percentile([3.0], 99) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0


def with_limits(history: History, queues: dict[int, str], keys: dict[int, str]) -> History:
    for r in history.rows:
        r.queue = queues.get(r.id, "other")
        r.serial_key = keys.get(r.id)
    return history


def test_limits_that_held_pass():
    # At 100.0 jobs 1-5 all run: five at once in queue q.
    history = with_limits(good_history(), dict.fromkeys(range(1, 8), "q"), {1: "a", 2: "b"})
    history.caps = {"q": 5}
    report = check(history)
    assert report.ok, report.violations
    assert report.stats["most_running"] == {"q": 5}
    assert report.stats["serial_keys"] == 2
    assert report.stats["serial_overlaps"] == 0


def test_a_queue_past_its_cap_is_caught():
    history = with_limits(good_history(), dict.fromkeys(range(1, 8), "q"), {})
    history.caps = {"q": 4}
    report = check(history)
    assert kinds(report) == {"cap_exceeded"}
    assert len(report.violations) == 1  # one excess, reported once


def test_a_rescued_holder_no_longer_counts_against_the_cap():
    # Job 5's first holder (SIGSTOPped) is rescued at 104 and resumes until
    # 110; from 105 jobs 4 and 5 run again elsewhere: two at once, not three.
    history = with_limits(good_history(), {4: "r", 5: "r"}, {})
    history.caps = {"r": 2}
    report = check(history)
    assert report.ok, report.violations
    assert report.stats["most_running"] == {"r": 2}
    history.caps = {"r": 1}
    assert kinds(check(history)) == {"cap_exceeded"}


def test_two_jobs_of_a_serial_key_at_once_are_caught():
    history = with_limits(good_history(), {}, {1: "user:1", 2: "user:1"})
    report = check(history)
    assert kinds(report) == {"serial_overlap"}
    assert report.stats["serial_overlaps"] == 1


def test_a_rescued_holder_no_longer_holds_its_serial_key():
    # Job 1 now runs 104.5-104.9: after job 5's frozen first holder was
    # rescued (104), before its second attempt started (105).
    history = with_limits(good_history(), {}, {1: "user:5", 5: "user:5"})
    history.events = [e for e in history.events if e.job != 1] + run(1, 1, W1, 104.5, 104.9)
    row(history, 1).finished_at = 104.95
    history.acks = [a for a in history.acks or [] if a.job != 1] + [
        Ack(1, "completed", W1, 1, 104.95)
    ]
    report = check(history)
    assert report.ok, report.violations
    # Without the rescue its frozen holder would still hold the key.
    row(history, 5).errors = []
    history.heartbeats = None
    history.acks = None
    assert "serial_overlap" in kinds(check(history))


def free_return_history(returned_by: str) -> History:
    """Job 8 started on W4 at 99.9, its start mark unwritten when W4 was
    stopped (100..109): the rescuer gave it back free at 104 (no errors
    entry, attempt not spent) and W1 ran attempt 1 again from 105."""
    history = good_history()
    history.enqueued[8] = Expected(8, "ok")
    history.events += run(8, 1, W4, 99.9, 109.2) + run(8, 1, W1, 105.0, 105.5)
    history.rows.append(Row(8, "completed", 1, 20, 8, result(8, W1, 1), [], 105.51))
    assert history.acks is not None
    history.acks += [Ack(8, "available", returned_by, 1, 104.0), Ack(8, "completed", W1, 1, 105.51)]
    return history


def test_a_free_return_from_a_silent_holder_justifies_its_overlap():
    report = check(free_return_history(W4))
    assert report.ok, report.violations
    assert report.stats["free_returns"] == 1
    assert report.stats["rescues"] == 2


def test_a_hand_back_by_a_live_holder_justifies_no_overlap():
    history = free_return_history(W4)
    history.heartbeats[W4] = beats(95, 115)  # type: ignore[index]
    report = check(history)
    assert report.stats["free_returns"] == 0
    assert any(v.kind == "overlap" and v.job == 8 for v in report.violations)
