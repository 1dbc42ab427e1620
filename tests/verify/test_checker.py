"""``jobkeeper verify``'s history checker on crafted histories: a clean one
passes, and each kind of broken one (a lost job, an overlap of live holders,
an ack by a non-holder, a rescue of a live holder, a wrong outcome) fails
with the violation that names it.
"""

from __future__ import annotations

from pathlib import Path

from jobkeeper.verify.history import (
    Event,
    ExecLog,
    History,
    Life,
    Row,
    check,
    read_exec_logs,
)

W1 = "host:101:aaaa"
W2 = "host:102:bbbb"
RESCUE_AFTER = 3.0


def lives(**overrides: Life) -> list[Life]:
    base = {"w1": Life(101, 0.0), "w2": Life(102, 0.0)}
    base.update(overrides)
    return list(base.values())


def run(
    job: int,
    attempt: int,
    worker: str,
    start: float,
    end: float | None,
    outcome: str = "ok",
    fence: int = 0,
):
    events = [Event("S", job, attempt, worker, start, fence=fence)]
    if end is not None:
        events.append(Event("E", job, attempt, worker, end, outcome, fence))
    return events


def completed(job: int, attempt: int, worker: str, errors=None, fence: int = 0) -> Row:
    result = {"n": job, "worker": worker, "attempt": attempt, "fence": fence}
    return Row(job, "completed", attempt, result, errors or [])


def rescue_entry(attempt: int, worker: str) -> dict[str, object]:
    return {
        "attempt": attempt,
        "at": "2026-01-01T00:00:00+00:00",
        "error": f"worker lost: {worker} sent no heartbeat for more than 3s",
    }


def clean() -> History:
    return History(
        rescue_after=RESCUE_AFTER,
        enqueued={1: "ok", 2: "ok", 3: "fail", 4: "cancel"},
        rows=[
            completed(1, 1, W1),
            completed(2, 1, W2),
            Row(3, "dead", 2),
            Row(4, "cancelled", 0),
        ],
        events=[
            *run(1, 1, W1, 10.0, 10.5),
            *run(2, 1, W2, 10.2, 10.4),
            *run(3, 1, W1, 11.0, 11.1, "error"),
            *run(3, 2, W2, 11.5, 11.6, "error"),
        ],
        lives=lives(),
    )


def kinds(history: History) -> list[str]:
    return sorted({v.kind for v in check(history).violations})


def test_a_clean_history_passes():
    report = check(clean())
    assert report.ok, report.violations
    assert report.stats["lost"] == 0
    assert report.stats["overlaps"] == 0
    assert report.stats["jobs"] == 4


def test_a_lost_job_fails():
    history = clean()
    history.rows = [row for row in history.rows if row.id != 2]
    report = check(history)
    assert kinds(history) == ["lost"]
    assert report.stats["lost"] == 1


def test_a_job_stuck_unfinished_fails():
    history = clean()
    history.rows[1] = Row(2, "running", 1)
    assert kinds(history) == ["not_terminal"]


def test_a_wrong_outcome_fails():
    history = clean()
    history.rows[2] = completed(3, 2, W2)
    assert "wrong_outcome" in kinds(history)


def test_two_live_holders_at_once_are_an_overlap():
    history = clean()
    # Job 1's second attempt starts on W2 while W1, never stopped, still runs it.
    history.events += run(1, 2, W2, 10.3, 10.6)
    history.rows[0] = completed(1, 2, W2, [rescue_entry(1, W1)])
    report = check(history)
    assert "overlap" in kinds(history)
    assert report.stats["overlaps"] == 1


def test_an_overlap_after_the_holder_was_stopped_past_rescue_after_is_justified():
    history = clean()
    # W1 SIGSTOPped at 10.1 for 6 s; the job is rescued and runs on W2 at 13.5.
    history.lives = lives(w1=Life(101, 0.0, pauses=[(10.1, 16.1)]))
    history.events = [e for e in history.events if e.job != 1]
    history.events += run(1, 1, W1, 10.0, 16.2, "error")
    history.events += run(1, 2, W2, 13.5, 13.7)
    history.rows[0] = completed(1, 2, W2, [rescue_entry(1, W1)])
    report = check(history)
    assert report.ok, report.violations
    assert report.stats["overlaps_justified"] == 1
    assert report.stats["rescues"] == 1


def test_an_overlap_before_rescue_after_had_passed_is_not_justified():
    history = clean()
    history.lives = lives(w1=Life(101, 0.0, pauses=[(10.1, 16.1)]))
    history.events = [e for e in history.events if e.job != 1]
    history.events += run(1, 1, W1, 10.0, 16.2, "error")
    history.events += run(1, 2, W2, 11.0, 11.2)  # 0.9 s into the pause
    history.rows[0] = completed(1, 2, W2, [rescue_entry(1, W1)])
    assert kinds(history) == ["overlap"]


def test_a_stopped_holders_silence_may_start_a_heartbeat_before_its_sigstop():
    history = clean()
    history.heartbeat_interval = 0.5
    history.lives = lives(w1=Life(101, 0.0, pauses=[(10.1, 16.1)]))
    history.events = [e for e in history.events if e.job != 1]
    history.events += run(1, 1, W1, 10.0, 16.2, "error")
    history.events += run(1, 1, W2, 12.85, 13.0)  # 2.75 s after the SIGSTOP
    history.rows[0] = completed(1, 1, W2)
    assert check(history).ok
    history.heartbeat_interval = 0.0
    assert kinds(history) == ["overlap"]


def test_a_killed_holder_does_not_overlap_its_successor():
    history = clean()
    history.lives = lives(w1=Life(101, 0.0, ended=10.3, killed=True))
    history.events = [e for e in history.events if e.job != 1]
    history.events += run(1, 1, W1, 10.0, None)  # cut short by SIGKILL
    history.events += run(1, 2, W2, 13.4, 13.5)
    history.rows[0] = completed(1, 2, W2, [rescue_entry(1, W1)])
    report = check(history)
    assert report.ok, report.violations
    assert report.stats["cut_short"] == 1


def test_a_completion_by_a_rescued_holder_is_an_ack_by_a_non_holder():
    history = clean()
    history.lives = lives(w1=Life(101, 0.0, pauses=[(10.1, 16.1)]))
    history.events = [e for e in history.events if e.job != 1]
    history.events += run(1, 1, W1, 10.0, 16.2)
    history.events += run(1, 2, W2, 13.5, 13.7)
    # The row is at attempt 2, but the stored result is the stale attempt 1's.
    history.rows[0] = Row(1, "completed", 2, {"n": 1, "worker": W1, "attempt": 1})
    assert "bad_completion" in kinds(history)


def test_a_completion_by_the_holder_a_claim_was_taken_from_fails():
    history = clean()
    # A free return: the attempt was claimed again (same number) by W2, yet
    # W1's late result was stored.
    history.lives = lives(w1=Life(101, 0.0, pauses=[(10.1, 16.1)]))
    history.events = [e for e in history.events if e.job != 1]
    history.events += run(1, 1, W1, 10.0, 16.2, fence=1)
    history.events += run(1, 1, W2, 13.5, 13.7, fence=2)
    history.rows[0] = completed(1, 1, W1, fence=1)
    assert kinds(history) == ["bad_completion"]


def test_the_same_worker_claiming_an_attempt_again_after_a_free_return_passes():
    # W1 was stopped holding job 1 (fence 1, never started), the claim was
    # given back free, and W1 claimed attempt 1 again (fence 2) and ran it:
    # one worker, one attempt number, two claims.
    history = clean()
    history.lives = lives(w1=Life(101, 0.0, pauses=[(9.0, 14.0)]))
    history.events = [e for e in history.events if e.job != 1]
    history.events += run(1, 1, W1, 14.5, 15.0, fence=2)
    history.rows[0] = completed(1, 1, W1, fence=2)
    assert kinds(history) == []
    # Its first claim too started (before the stop) and ran to an end the
    # fence refused: the stored result must be the second claim's.
    history.events += run(1, 1, W1, 8.9, 14.2, fence=1)
    assert kinds(history) == []
    history.rows[0] = completed(1, 1, W1, fence=1)
    assert kinds(history) == ["bad_completion"]


def test_a_result_whose_execution_failed_is_a_bad_completion():
    history = clean()
    history.events = [e for e in history.events if e.job != 2]
    history.events += run(2, 1, W2, 10.2, 10.4, "error")
    assert kinds(history) == ["bad_completion"]


def test_a_rescue_of_a_holder_never_silenced_fails():
    history = clean()
    history.rows[0] = completed(1, 2, W1, [rescue_entry(1, W2)])
    history.events += run(1, 2, W1, 14.0, 14.1)
    history.events = [e for e in history.events if not (e.job == 1 and e.attempt == 1)]
    history.events += run(1, 1, W2, 9.0, 9.5, "error")
    assert "rescued_live_holder" in kinds(history)


def test_phantoms_and_malformed_logs_fail():
    history = clean()
    history.events += run(99, 1, W1, 12.0, 12.1)
    history.bad_log_lines = 2
    assert kinds(history) == ["bad_log", "phantom"]


def test_the_exec_log_round_trips(tmp_path: Path):
    log = ExecLog(tmp_path)
    log.start(7, 1, W1, 3)
    log.end(7, 1, W1, 3, "ok")
    with (tmp_path / "exec-garbage.log").open("w") as f:
        f.write("S\tnot-a-number\n")
    events, bad = read_exec_logs(tmp_path)
    assert [(e.kind, e.job, e.attempt, e.worker, e.fence, e.outcome) for e in events] == [
        ("S", 7, 1, W1, 3, ""),
        ("E", 7, 1, W1, 3, "ok"),
    ]
    assert bad == 1
