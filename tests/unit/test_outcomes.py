"""What a failed attempt leads to, and that its bookkeeping is always storable
(a failure that cannot be written would leave the job stuck).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from jobkeeper.config import Settings
from jobkeeper.models import FailureKind, Job, JobStatus
from jobkeeper.outcomes import (
    MAX_ERROR_CHARS,
    cancelled_attempt,
    claim_of,
    error_entry,
    failed_attempt,
    released_attempt,
)

NOW = datetime(2024, 1, 1, tzinfo=UTC)
UNSTORABLE = "upstream said \x00 no \ud800 " + "x" * 5_000_000


def running(attempt: int = 1, max_attempts: int = 3) -> Job:
    return Job(
        id=7,
        task="t",
        args={},
        queue="default",
        status=JobStatus.RUNNING,
        priority=0,
        attempt=attempt,
        max_attempts=max_attempts,
        scheduled_at=NOW,
        created_at=NOW,
        worker_id="w-1",
    )


def assert_storable(text: str | None, limit: int) -> None:
    assert text is not None
    assert "\x00" not in text
    text.encode("utf-8")  # no lone surrogates
    assert len(text) <= limit + 64


def test_retry_until_max_attempts_then_dead():
    settings = Settings(backoff_base=2.0, max_backoff=100.0)
    first = failed_attempt(running(1), settings, error="boom")
    assert (first.outcome, first.claim) == ("retryable", claim_of(running(1)))
    assert 0.0 <= first.retry_in <= 2.0
    last = failed_attempt(running(3), settings, error="boom")
    assert last.outcome == "dead"
    assert last.reason is not None and "max_attempts=3" in last.reason
    chosen = failed_attempt(running(1), settings, error="later", retry_in=42.0)
    assert (chosen.outcome, chosen.retry_in) == ("retryable", 42.0)


def test_error_entry_is_json_with_the_attempt():
    entry = json.loads(error_entry(running(2), "boom", "Traceback..."))
    assert entry == {"attempt": 2, "at": None, "error": "boom", "traceback": "Traceback..."}


def test_unstorable_error_text_is_cleaned_and_bounded():
    failure = failed_attempt(running(3), Settings(), error=UNSTORABLE, traceback=UNSTORABLE)
    entry = json.loads(failure.error_json)
    assert_storable(entry["error"], MAX_ERROR_CHARS)
    assert_storable(entry["traceback"], 16_000)
    assert_storable(failure.reason, 1000)


@pytest.mark.parametrize("reason", ["a\x00b", "lone \udc80 surrogate", UNSTORABLE])
def test_discard_reason_is_storable(reason):
    failure = failed_attempt(running(1), Settings(), error="discarded", discard_reason=reason)
    assert failure.outcome == "dead"
    assert_storable(failure.reason, 1000)
    assert failure.reason is not None and failure.reason.startswith("discarded: ")


@pytest.mark.parametrize("make", [cancelled_attempt, released_attempt])
def test_cancel_and_release_entries_are_storable(make):
    failure = make(running(1), UNSTORABLE)
    assert_storable(json.loads(failure.error_json)["error"], MAX_ERROR_CHARS)


def test_claim_of_a_job_without_holder_is_refused():
    job = running()
    idle = Job(**{**{f: getattr(job, f) for f in job.__slots__}, "worker_id": None})
    with pytest.raises(ValueError, match="not running"):
        claim_of(idle)


def test_outcome_kinds_are_the_strings_the_sql_compares():
    # The outcome SQL matches these exact strings: renaming a value would
    # leave failures unwritten.
    assert [kind.value for kind in FailureKind] == [
        "retryable",
        "dead",
        "cancelled",
        "released",
        "returned",
        "snoozed",
    ]
    assert FailureKind.RELEASED == "released"


def test_outcome_helpers_return_kinds():
    job = running()
    assert type(failed_attempt(job, Settings(), error="e").outcome) is FailureKind
    assert cancelled_attempt(job, "stop").outcome is FailureKind.CANCELLED
    assert released_attempt(job, None).outcome is FailureKind.RELEASED
