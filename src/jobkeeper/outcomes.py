"""Deciding what a failed attempt leads to: retry (with backoff), dead letter,
cancellation or release. Shared by the worker's executor and the rescuer so a
crash and an exception follow the same policy (C-05: a crash spends an attempt
and backs off like any failure).
"""

from __future__ import annotations

import json

from jobkeeper.backoff import ABSOLUTE_MAX_BACKOFF, backoff_delay
from jobkeeper.config import Settings
from jobkeeper.events import OutcomeKind
from jobkeeper.models import Claim, Completion, Failure, Job
from jobkeeper.payload import clean_text, dumps

#: Longest stored error message / traceback, in characters (C-09: a 5 MB
#: message must not make the failure unrecordable).
MAX_ERROR_CHARS = 4_000
MAX_TRACEBACK_CHARS = 16_000


def claim_of(job: Job) -> Claim:
    """The fence of a held (claimed or running) job."""
    if job.worker_id is None:
        raise ValueError(f"job {job.id} is not running nor claimed (no holder)")
    return Claim(job.id, job.worker_id, job.attempt, job.fence)


def error_entry(job: Job, error: str, traceback: str | None) -> str:
    """One entry of ``errors`` as JSON; the database fills in ``at``."""
    return dumps(
        {
            "attempt": job.attempt,
            "at": None,
            "error": clean_text(error, max_chars=MAX_ERROR_CHARS),
            "traceback": None
            if traceback is None
            else clean_text(traceback, max_chars=MAX_TRACEBACK_CHARS),
        }
    )


def failed_attempt(
    job: Job,
    settings: Settings,
    *,
    error: str,
    traceback: str | None = None,
    retry_in: float | None = None,
    discard_reason: str | None = None,
) -> Failure:
    """The outcome of a failed attempt under the retry policy.

    Args:
        job: the running job (its ``attempt`` is the attempt that failed).
        settings: for the backoff base and cap.
        error: one-line description, stored (cleaned and truncated) in ``errors``.
        traceback: the formatted traceback, if any.
        retry_in: seconds until the retry (``Retry(delay=...)``); ``None``
            for the exponential backoff.
        discard_reason: set to send the job to the dead letters at once.

    Returns:
        A dead-letter move when discarded or when ``attempt >= max_attempts``,
        else a retry after the backoff.
    """
    entry = error_entry(job, error, traceback)
    claim = claim_of(job)
    if discard_reason is not None:
        # Cleaned like the error text: a NUL or lone surrogate in the reason
        # would make the dead-letter write fail and leave the job running.
        reason = clean_text(f"discarded: {discard_reason}", max_chars=1000)
        return Failure(claim, "dead", entry, reason=reason)
    if job.attempt >= job.max_attempts:
        reason = f"max_attempts={job.max_attempts} exhausted; last error: {error}"
        return Failure(claim, "dead", entry, reason=clean_text(reason, max_chars=1000))
    if retry_in is None:
        retry_in = backoff_delay(
            job.attempt, base=settings.backoff_base, max_backoff=settings.max_backoff
        )
    # Retry(delay=1e12) would put scheduled_at past what PostgreSQL can store,
    # and the failure could then never be written: cap it like the backoff.
    return Failure(claim, "retryable", entry, retry_in=min(retry_in, ABSOLUTE_MAX_BACKOFF))


def cancelled_attempt(job: Job, reason: str) -> Failure:
    """The running job stops as ``cancelled`` (asked for with ``cancel``)."""
    return Failure(claim_of(job), "cancelled", error_entry(job, reason, None))


def released_attempt(job: Job, reason: str | None) -> Failure:
    """The running job is handed back at shutdown: available again, the
    interrupted attempt not spent, the hand-back noted in ``errors`` (not
    with ``reason`` None: for a job that was only prefetched, nothing
    happened to it worth recording).
    """
    error = None if reason is None else error_entry(job, reason, None)
    return Failure(claim_of(job), "released", error)


def returned_attempt(job: Job, reason: str) -> Failure:
    """A claimed job whose holder was lost before its start was recorded
    goes back to available, the attempt not spent and the return counted in
    ``unstarted_returns`` (the rescuer bounds them). Written only while the
    job is still claimed. ``reason`` is noted in ``errors``: the lost holder
    is worth knowing about even though the attempt was not spent.
    """
    return Failure(claim_of(job), "returned", error_entry(job, reason, None))


#: The event name of each outcome a worker writes.
OUTCOME_KINDS = {
    "retryable": OutcomeKind.RETRIED,
    "dead": OutcomeKind.DEAD,
    "cancelled": OutcomeKind.CANCELLED,
    "released": OutcomeKind.RELEASED,
    "returned": OutcomeKind.RELEASED,
}


def outcome_kind(outcome: Completion | Failure) -> OutcomeKind:
    """How ``outcome`` ended its attempt, as an event names it."""
    if isinstance(outcome, Completion):
        return OutcomeKind.COMPLETED
    return OUTCOME_KINDS[outcome.outcome]


def outcome_error(outcome: Completion | Failure) -> str | None:
    """The error text ``outcome`` adds to the job's ``errors``, if any."""
    if isinstance(outcome, Completion) or outcome.error_json is None:
        return None
    error = json.loads(outcome.error_json).get("error")
    return error if isinstance(error, str) else None
