"""C-09: a NUL in an error message or result means the failure cannot be
recorded, so the job is stuck (fazer-ai/agents#243, pg-boss via
akash-network/console#3898, windmill#10274).

Every text a task can put into a failure (its exception's message and
traceback, a Retry reason, a Discard reason) is made storable before it is
written: NUL escaped visibly, lone surrogates escaped, size bounded. A result
that cannot be stored fails its attempt with a clear "result not storable"
error. In no case does a job stay running, and the worker stays up.
"""

from __future__ import annotations

from typing import Any

from backends.helpers import claim
from jobkeeper import Discard, JobStatus, Retry
from jobkeeper.config import Settings
from jobkeeper.outcomes import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS, failed_attempt
from support.waiting import wait_status
from worker.helpers import error_texts, running, running_count

#: What clean_text adds around a cut: a line saying how much was cut.
CUT_MARKER = 60


def assert_storable(text: str, limit: int) -> None:
    """No NUL, no lone surrogate, at most ``limit`` characters plus the cut line."""
    assert "\x00" not in text
    assert not any("\ud800" <= ch <= "\udfff" for ch in text)
    assert len(text) <= limit + CUT_MARKER


def test_c09_unstorable_discard_reason_and_error_text_are_still_recorded(jq):
    """A Discard reason or error text with NUL / lone surrogates / megabytes
    must not make the failure write fail (the job would stay running)."""
    nasty = "upstream said \x00 no \ud800 " + "x" * 2_000_000
    discarded = jq.enqueue("t", {}, queue="d")
    retried = jq.enqueue("t", {}, queue="r")
    (running_d,) = claim(jq, "d")
    (running_r,) = claim(jq, "r")
    failures = [
        failed_attempt(running_d, Settings(), error=nasty, traceback=nasty, discard_reason=nasty),
        failed_attempt(running_r, Settings(), error=nasty, traceback=nasty, retry_in=0),
    ]
    assert jq.backend.job_fail_many(failures=failures) == {discarded.id, retried.id}
    dead = jq.get_job(discarded.id)
    assert dead is not None and dead.status == JobStatus.DEAD
    assert dead.dead_reason is not None and dead.dead_reason.startswith("discarded: ")
    assert "\\x00" in dead.dead_reason
    again = jq.get_job(retried.id)
    assert again is not None and again.status == JobStatus.RETRYABLE
    (entry,) = again.errors
    assert "\\x00" in entry["error"] and len(entry["error"]) < 10_000


def test_c09_unstorable_error_text_and_results_are_recorded_and_dead_lettered(make_queue):
    jq = make_queue()

    @jq.task(max_attempts=2)
    def a_nul() -> None:
        raise RuntimeError("upstream said \x00 no")

    @jq.task(max_attempts=2)
    def b_nul_result() -> dict[str, Any]:
        return {"r": "x\x00y"}

    @jq.task(max_attempts=2)
    def c_surrogate() -> None:
        raise RuntimeError("bad \ud800 surrogate")

    @jq.task(max_attempts=2)
    def d_huge() -> None:
        raise RuntimeError("x" * (5 * 1024 * 1024))

    @jq.task(max_attempts=2)
    async def e_async_nul_key() -> None:
        raise KeyError("key\x00with nul \udfff")

    @jq.task(max_attempts=2)
    def f_discard_nul() -> None:
        raise Discard("bad \x00 reason \ud800")

    @jq.task
    def fine() -> str:
        return "still up"

    jobs = {t.name: t.enqueue().id for t in (a_nul, b_nul_result, c_surrogate, d_huge)}
    jobs["e"] = e_async_nul_key.enqueue().id
    jobs["f"] = f_discard_nul.enqueue().id
    with running(jq.worker(concurrency=5)):
        finished = wait_status(
            jq, list(jobs.values()), {JobStatus.DEAD, JobStatus.COMPLETED}, timeout=60
        )
        # The worker stays up.
        ok = fine.enqueue()
        wait_status(jq, [ok.id], {JobStatus.COMPLETED})
    by_task = {j.task: j for j in finished}
    for name in ("a_nul", "c_surrogate", "d_huge", "e_async_nul_key"):
        dead = by_task[name]
        assert dead.status == JobStatus.DEAD, dead
        assert dead.attempt == 2
        assert [e["attempt"] for e in dead.errors] == [1, 2]
        for entry in dead.errors:
            assert_storable(entry["error"], MAX_ERROR_CHARS)
            assert_storable(entry["traceback"] or "", MAX_TRACEBACK_CHARS)
    # NUL and surrogates are escaped visibly, the rest of the message kept.
    assert "RuntimeError: upstream said \\x00 no" in by_task["a_nul"].errors[0]["error"]
    assert "bad \\ud800 surrogate" in by_task["c_surrogate"].errors[1]["error"]
    assert "characters cut" in by_task["d_huge"].errors[0]["error"]
    discarded = by_task["f_discard_nul"]
    assert discarded.status == JobStatus.DEAD and discarded.attempt == 1
    assert "bad" in (discarded.dead_reason or "") and "\x00" not in (discarded.dead_reason or "")
    b = by_task["b_nul_result"]
    if b.status == JobStatus.COMPLETED:
        assert "\x00" not in str(b.result)
    else:
        # Dead at once: retrying would only repeat the task to the same end.
        assert b.status == JobStatus.DEAD and b.attempt == 1
        assert all("result not storable" in text for text in error_texts(b))
        assert all("NUL" in text for text in error_texts(b))
    assert running_count(jq) == 0


def test_c09_retry_reasons_and_odd_results_never_leave_a_job_running(make_queue):
    jq = make_queue()
    nasty = "reason \x00 with \udc80 and " + "y" * (5 * 1024 * 1024)

    @jq.task(max_attempts=2)
    def retry_nasty() -> None:
        raise Retry(delay=0, reason=nasty)

    class Odd(Exception):
        def __str__(self) -> str:
            return nasty

    @jq.task(max_attempts=2)
    def odd_str() -> None:
        raise Odd()

    @jq.task(max_attempts=2)
    def surrogate_result() -> dict[str, Any]:
        return {"r": "\ud800"}

    @jq.task(max_attempts=2)
    def huge_result() -> str:
        return "z" * (5 * 1024 * 1024)  # past max_payload_bytes (1 MiB)

    @jq.task(max_attempts=2)
    async def async_nul_result() -> list[str]:
        return ["a\x00"]

    @jq.task
    def fine() -> str:
        return "still up"

    tasks = (retry_nasty, odd_str, surrogate_result, huge_result, async_nul_result)
    ids = [t.enqueue().id for t in tasks]
    with running(jq.worker(concurrency=4)):
        ended = wait_status(jq, ids, {JobStatus.DEAD}, timeout=60)
        ok = fine.enqueue()
        wait_status(jq, [ok.id], {JobStatus.COMPLETED})
    by_task = {j.task: j for j in ended}
    for name in ("retry_nasty", "odd_str"):
        dead = by_task[name]
        assert [e["attempt"] for e in dead.errors] == [1, 2], dead
        for entry in dead.errors:
            assert_storable(entry["error"], MAX_ERROR_CHARS)
            assert "\\x00" in entry["error"] and "characters cut" in entry["error"]
    for name in ("surrogate_result", "huge_result", "async_nul_result"):
        dead = by_task[name]
        assert dead.attempt == 1, dead  # retrying would only repeat the task's effects
        assert all("result not storable" in text for text in error_texts(dead)), dead
    assert "max_payload_bytes" in error_texts(by_task["huge_result"])[0]
    assert running_count(jq) == 0
