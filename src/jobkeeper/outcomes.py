"""Deciding what a failed attempt leads to: retry (with backoff), dead letter,
cancellation or release. Shared by the worker's executor and the rescuer so a
crash and an exception follow the same policy: a crash spends an attempt and
backs off like any failure, so a job that kills its worker still reaches the
dead letters.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable

from jobkeeper.backoff import ABSOLUTE_MAX_BACKOFF, backoff_delay
from jobkeeper.config import Settings
from jobkeeper.errors import shown
from jobkeeper.events import OutcomeKind
from jobkeeper.frozen import frozen_builder
from jobkeeper.models import Claim, Completion, Failure, FailureKind, Job
from jobkeeper.payload import clean_text, dumps

logger = logging.getLogger("jobkeeper")

#: A task's retry policy: ``(attempt that failed, its error) -> seconds``.
BackoffFunction = Callable[[int, BaseException], float]

#: Longest stored error message / traceback, in characters: a failure with a
#: message of megabytes must still be recordable.
MAX_ERROR_CHARS = 4_000
MAX_TRACEBACK_CHARS = 16_000

# Every attempt a worker runs builds its claim twice (start mark, outcome)
# and most build a Completion: the frozen dataclasses' own __init__ took
# 0.55 us and 0.42 us, these 0.2 us each (see frozen_builder).
_claim = frozen_builder(Claim, ("job_id", "worker_id", "attempt", "fence"))
_completion = frozen_builder(Completion, ("claim", "result_json"))


def claim_of(job: Job) -> Claim:
    """The fence of a held (claimed or running) job."""
    if job.worker_id is None:
        raise ValueError(f"job {job.id} is not running nor claimed (no holder)")
    return _claim(job.id, job.worker_id, job.attempt, job.fence)


def completed_attempt(job: Job, result_json: str | None) -> Completion:
    """The outcome of an attempt whose task returned ``result_json``."""
    return _completion(claim_of(job), result_json)


def error_entry(job: Job, error: str, traceback: str | None) -> str:
    """One entry of ``errors`` as JSON; the database fills in ``at``."""
    return _entry(job.attempt, error, traceback)


def _entry(attempt: int, error: str, traceback: str | None) -> str:
    return dumps(
        {
            "attempt": attempt,
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
    backoff: BackoffFunction | None = None,
    exc: BaseException | None = None,
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
        backoff: the task's own retry policy, called with ``(job.attempt,
            exc)`` when ``retry_in`` is None; ``None`` for the exponential
            default. One that raises or returns no usable number of seconds
            is logged and the default used instead: the job is never lost to
            its retry policy.
        exc: the exception the attempt ended with, for ``backoff``.

    Returns:
        A dead-letter move when discarded or when ``attempt >= max_attempts``,
        else a retry after the backoff.
    """
    entry = error_entry(job, error, traceback)
    claim = claim_of(job)
    if discard_reason is not None:
        return _discarded(claim, entry, discard_reason)
    if job.attempt >= job.max_attempts:
        reason = f"max_attempts={job.max_attempts} exhausted; last error: {error}"
        return Failure(claim, FailureKind.DEAD, entry, reason=clean_text(reason, max_chars=1000))
    if retry_in is None and backoff is not None:
        retry_in = task_backoff(backoff, job, exc)
    if retry_in is None:
        retry_in = backoff_delay(
            job.attempt, base=settings.backoff_base, max_backoff=settings.max_backoff
        )
    # Retry(delay=1e12) would put scheduled_at past what PostgreSQL can store,
    # and the failure could then never be written: cap it like the backoff.
    return Failure(
        claim, FailureKind.RETRYABLE, entry, retry_in=min(retry_in, ABSOLUTE_MAX_BACKOFF)
    )


def unstorable_result(claim: Claim, exc: BaseException) -> Failure:
    """The attempt of a task whose result cannot be stored, refused by the
    encoder (:class:`PayloadError`) or by the database (:class:`DataRejected`,
    a character its encoding cannot hold): straight to the dead letters,
    whatever ``max_attempts``. The same code returns the same kind of value,
    so retries would only repeat the task's side effects to the same end.
    """
    error = f"result not storable: {exc}"
    return _discarded(
        claim,
        _entry(claim.attempt, error, None),
        f"{error} (the task ran to its end: fix what it returns, then requeue)",
    )


def _discarded(claim: Claim, entry: str, discard_reason: str) -> Failure:
    """The attempt sends its job to the dead letters at once."""
    # Cleaned like the error text: a NUL or lone surrogate in the reason
    # would make the dead-letter write fail and leave the job running.
    reason = clean_text(f"discarded: {discard_reason}", max_chars=1000)
    return Failure(claim, FailureKind.DEAD, entry, reason=reason)


def cancelled_attempt(job: Job, reason: str) -> Failure:
    """The running job stops as ``cancelled`` (asked for with ``cancel``)."""
    return Failure(claim_of(job), FailureKind.CANCELLED, error_entry(job, reason, None))


def released_attempt(job: Job, reason: str | None) -> Failure:
    """The running job is handed back at shutdown: available again, the
    interrupted attempt not spent, the hand-back noted in ``errors`` (not
    with ``reason`` None: for a job that was only prefetched, nothing
    happened to it worth recording).
    """
    error = None if reason is None else error_entry(job, reason, None)
    return Failure(claim_of(job), FailureKind.RELEASED, error)


def returned_attempt(job: Job) -> Failure:
    """A claimed job whose holder was lost before its start was recorded
    goes back to available, the attempt not spent and the return counted in
    ``unstarted_returns`` (the rescuer bounds them). Written only while the
    job is still claimed. Nothing is added to ``errors``, which holds one
    entry per failed attempt: this attempt never ran here (the rescuer logs
    the lost holder instead).
    """
    return Failure(claim_of(job), FailureKind.RETURNED, None)


def task_backoff(backoff: BackoffFunction, job: Job, exc: BaseException | None) -> float | None:
    """Seconds a task's own ``backoff`` asks for after ``job``'s attempt
    failed, or None (the default applies) when it raised or returned no
    finite number >= 0 (infinity, NaN, an int past float's range; both
    logged). A finite result is capped at ``ABSOLUTE_MAX_BACKOFF``.
    """
    error = exc if exc is not None else RuntimeError("attempt failed")
    try:
        value = backoff(job.attempt, error)
    except Exception:
        logger.exception(
            "job %s (%s): the task's backoff function raised; the default backoff is used",
            job.id,
            job.task,
        )
        return None
    seconds = _finite_seconds(value)
    if seconds is None:
        logger.warning(
            "job %s (%s): the task's backoff function returned %s, not finite seconds >= 0; "
            "the default backoff is used",
            job.id,
            job.task,
            shown(value),
        )
        return None
    return min(seconds, ABSOLUTE_MAX_BACKOFF)


def _finite_seconds(value: object) -> float | None:
    """``value`` as finite seconds >= 0, or None: the values ``Retry(delay=...)``
    refuses (a bool, a non-number, NaN, infinity, an int past float's range,
    a negative) are the ones a backoff function falls back on.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # 10**400: finite as an int, no float holds it
        return None
    # An infinite delay would otherwise be capped to a silent 100-year park.
    if not (0.0 <= seconds < math.inf):
        return None
    return seconds


def snoozed_attempt(job: Job, delay: float) -> Failure:
    """The running job asked to run again in ``delay`` seconds (``Snooze``):
    back to scheduled, the attempt given back, no entry in ``errors``. A
    cancel request still wins (the job ends cancelled).
    """
    return Failure(
        claim_of(job), FailureKind.SNOOZED, None, retry_in=min(delay, ABSOLUTE_MAX_BACKOFF)
    )


#: The event name of each outcome a worker writes.
OUTCOME_KINDS: dict[str, OutcomeKind] = {
    FailureKind.RETRYABLE: OutcomeKind.RETRIED,
    FailureKind.DEAD: OutcomeKind.DEAD,
    FailureKind.CANCELLED: OutcomeKind.CANCELLED,
    FailureKind.RELEASED: OutcomeKind.RELEASED,
    FailureKind.RETURNED: OutcomeKind.RELEASED,
    FailureKind.SNOOZED: OutcomeKind.SNOOZED,
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
