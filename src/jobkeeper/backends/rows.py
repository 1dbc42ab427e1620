"""Shared helpers of the backends: row decoding and batch shaping (internal)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from jobkeeper.frozen import frozen_builder
from jobkeeper.models import Claim, Completion, Failure, FailureKind, Job, JobStatus, NewJob
from jobkeeper.payload import decode_args

#: Outcomes of job_fail_many (dead goes through job_fail_many_dead).
UPDATE_OUTCOMES = frozenset(set(FailureKind) - {FailureKind.DEAD})
#: Most jobs one job_stage_due moves; a full pass reports the next due time
#: as 0, so the producer stages the rest at once.
STAGE_LIMIT = 10_000


class UnloadableJSON(str):
    """JSON text the database holds and Python's ``json`` cannot load: a
    number past Python's 4,300-digit int limit, nesting past its recursion
    limit (both valid ``jsonb``, in rows written outside jobkeeper). The
    driver hands it over as text instead of raising mid-fetch, which failed
    every read that met the row (``get_job``, ``jobs list``, a limited
    queue's claim); :func:`job_from_row` then reports it like any stored
    args that cannot be decoded (sidekiq#3294).
    """

    __slots__ = ()


def load_json(data: str | bytes) -> Any:
    """``json.loads`` for the driver: never raises (see :class:`UnloadableJSON`)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
        return UnloadableJSON(text)


def _json(value: Any, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return default
    return value


def _errors(value: Any) -> list[dict[str, Any]]:
    decoded = _json(value, [])
    return decoded if isinstance(decoded, list) else []


def _result(value: Any, *, json_decoded: bool) -> Any:
    if isinstance(value, UnloadableJSON):
        return None
    return value if json_decoded else _json(value, None)


#: Job's constructor taking every field (see frozen_builder): SQLite's claim
#: builds a Job per row through job_from_row.
_job_of_row = frozen_builder(Job, tuple(field.name for field in dataclasses.fields(Job)))


def job_from_row(
    row: dict[str, Any], to_datetime: Any, *, dead: bool = False, json_decoded: bool = False
) -> Job:
    """Build a :class:`Job` from a row dict (column name -> value).

    ``to_datetime`` converts the backend's stored timestamp to an aware UTC
    datetime. ``json_decoded``: the driver already decoded the JSON columns
    (psycopg and ``jsonb``), so a ``str`` there is a JSON string value, not
    JSON text to parse again. Never raises on bad args/errors JSON: a row
    written outside jobkeeper must not crash the worker that claims it
    (sidekiq#3294).
    """
    raw_args = row["args"]
    if json_decoded and isinstance(raw_args, str) and not isinstance(raw_args, UnloadableJSON):
        raw_args = json.dumps(raw_args)
    args, args_error = decode_args(raw_args)
    errors = _errors(row["errors"])
    return _job_of_row(
        id=int(row["id"]),
        task=row["task"],
        args=args,
        queue=row["queue"],
        status=JobStatus.DEAD if dead else JobStatus(row["status"]),
        priority=int(row["priority"]),
        attempt=int(row["attempt"]),
        max_attempts=int(row["max_attempts"]),
        scheduled_at=to_datetime(row["scheduled_at"]),
        created_at=to_datetime(row["created_at"]),
        attempted_at=to_datetime(row["attempted_at"]),
        finished_at=to_datetime(row["finished_at"]),
        worker_id=None if dead else row["worker_id"],
        unique_key=row["unique_key"],
        errors=errors,
        result=_result(row["result"], json_decoded=json_decoded),
        cancel_requested=False if dead else bool(row["cancel_requested"]),
        dead_reason=row["reason"] if dead else None,
        args_error=args_error,
        fence=_dead_letter_fence(row, errors) if dead else int(row["fence"]),
        unstarted_returns=0 if dead else int(row["unstarted_returns"]),
        serial_key=row.get("serial_key"),
        trace_context=row.get("trace_context"),
        # Rows from before schema version 10 have none of the crash budget's
        # columns; dead letters keep only the count.
        run_alone=False if dead else bool(row.get("run_alone", False)),
        crashes=int(row.get("crashes") or 0),
        alone_fence=None if dead or row.get("alone_fence") is None else int(row["alone_fence"]),
    )


def _dead_letter_fence(row: dict[str, Any], errors: list[dict[str, Any]]) -> int:
    """The fence a requeue of this dead letter gives back (dead_letter_requeue
    computes the same): its last claim's, or where none was recorded (0:
    moved before schema version 18, or by a worker of 17), the most of its
    attempts and errors entries, no claim adding more than one of each.
    """
    return max(int(row.get("fence") or 0), int(row["attempt"]), len(errors))


def insert_params(new: NewJob, run_at: Any) -> dict[str, Any]:
    """The named parameters of the one-row insert queries of both backends
    (a query that has no ``unique_key`` ignores it); ``run_at`` is the
    backend's form of ``new.run_at``.
    """
    return {
        "queue": new.queue,
        "task": new.task,
        "args": new.args_json,
        "priority": new.priority,
        "max_attempts": new.max_attempts,
        "delay": new.delay,
        "run_at": run_at,
        "unique_key": new.unique_key,
        "serial_key": new.serial_key,
        "trace_context": new.trace_context,
    }


def schedule_of(new: NewJob, now: datetime) -> tuple[JobStatus, datetime]:
    """A new job's status and ``scheduled_at`` given the database clock ``now``."""
    if new.delay is not None:
        return JobStatus.SCHEDULED, now + timedelta(seconds=new.delay)
    if new.run_at is not None:
        status = JobStatus.SCHEDULED if new.run_at > now else JobStatus.AVAILABLE
        return status, new.run_at
    return JobStatus.AVAILABLE, now


#: The fields :func:`job_from_new` gives a new job, in this order; every
#: other field takes its default.
_build_new_job = frozen_builder(
    Job,
    (
        "id", "task", "args", "queue", "status", "priority", "attempt", "max_attempts",
        "scheduled_at", "created_at", "unique_key", "serial_key", "trace_context",
    ),
)  # fmt: skip


def job_from_new(
    new: NewJob,
    job_id: int,
    now: datetime,
    stored: tuple[JobStatus, datetime] | None = None,
) -> Job:
    """The Job an insert just wrote, built from its input.

    ``now`` is the database clock of the inserting transaction; the status
    and ``scheduled_at`` are ``stored`` (as the insert returned them) or else
    follow the same rules as the ``job_insert_many`` queries.
    """
    if stored is not None:
        status, scheduled_at = stored
    elif new.delay is None and new.run_at is None:
        status, scheduled_at = JobStatus.AVAILABLE, now
    else:
        status, scheduled_at = schedule_of(new, now)
    return _build_new_job(
        job_id,
        new.task,
        new.args if new.args is not None else json.loads(new.args_json),
        new.queue,
        status,
        new.priority,
        0,
        new.max_attempts,
        scheduled_at,
        now,
        new.unique_key,
        new.serial_key,
        new.trace_context,
    )


def jobs_from_new(news: Iterable[NewJob], ids: Iterable[int], now: datetime) -> list[Job]:
    """:func:`job_from_new` for a bulk insert's jobs, ``news[i]`` stored as
    ``ids[i]``. A job to run now, whose args the API kept, is built without
    the per-job call: a bulk enqueue builds a thousand of them per batch.
    """
    available = JobStatus.AVAILABLE
    built: list[Job] = []
    append = built.append
    for new, job_id in zip(news, ids, strict=True):
        if new.delay is None and new.run_at is None and new.args is not None:
            append(
                _build_new_job(
                    job_id, new.task, new.args, new.queue, available, new.priority, 0,
                    new.max_attempts, now, now, new.unique_key, new.serial_key,
                    new.trace_context,
                )
            )  # fmt: skip
        else:
            append(job_from_new(new, job_id, now))
    return built


def jobs_from_rows(
    heads: Sequence[NewJob],
    args_jsons: Sequence[str],
    args_column: Sequence[Any],
    ids: Iterable[int],
    now: datetime,
) -> list[Job]:
    """:func:`jobs_from_new` for the rows of a
    :class:`~jobkeeper.models.NewJobStream` (its columns: row ``i`` is
    ``heads[i]`` with ``args_jsons[i]`` and ``args_column[i]``), stored as
    ``ids[i]``. A head that rows share is a task's given no options: its
    jobs run now.
    """
    available = JobStatus.AVAILABLE
    built: list[Job] = []
    append = built.append
    for head, args_json, args, job_id in zip(heads, args_jsons, args_column, ids, strict=True):
        if head.delay is None and head.run_at is None and args is not None:
            append(
                _build_new_job(
                    job_id, head.task, args, head.queue, available, head.priority, 0,
                    head.max_attempts, now, now, head.unique_key, head.serial_key,
                    head.trace_context,
                )
            )  # fmt: skip
        elif args_json is head.args_json:
            append(job_from_new(head, job_id, now))
        else:
            # Not one of a shared head's rows (those all have args), but
            # built right whatever comes.
            new = dataclasses.replace(head, args_json=args_json, args=args)
            append(job_from_new(new, job_id, now))
    return built


def aware_utc(value: datetime | None) -> Any:
    """PostgreSQL timestamptz (aware, in the session zone) -> aware UTC."""
    if value is None or value.tzinfo is UTC:
        return value
    return value.astimezone(UTC)


def match_inserted(
    jobs: Sequence[NewJob], inserted: Iterable[Job], existing: dict[tuple[str, str], Job]
) -> tuple[list[Job | None], list[int]]:
    """Pair each input with its inserted row, or its pending duplicate.

    ``inserted`` rows were written in input order (ascending ids); an input
    whose ``(task, unique_key)`` was skipped by ON CONFLICT resolves to
    ``existing``. Returns the per-input jobs and the indexes still unresolved
    (their duplicate finished between the insert and the lookup; insert again).
    """
    new_rows = sorted(inserted, key=lambda job: job.id)
    inserted_keys = {(job.task, job.unique_key) for job in new_rows if job.unique_key is not None}
    taken: set[tuple[str, str]] = set()
    rows = iter(new_rows)
    out: list[Job | None] = []
    unresolved: list[int] = []
    for index, new in enumerate(jobs):
        if new.unique_key is None:
            out.append(next(rows))
            continue
        key = (new.task, new.unique_key)
        if key in inserted_keys and key not in taken:
            taken.add(key)
            out.append(next(rows))
        elif key in existing:
            out.append(existing[key])
        else:
            out.append(None)
            unresolved.append(index)
    return out, unresolved


def completion_arrays(completions: Sequence[Completion]) -> dict[str, list[Any]]:
    """Parallel arrays for the batched completion statements."""
    return {
        "ids": [c.claim.job_id for c in completions],
        "worker_ids": [c.claim.worker_id for c in completions],
        "attempts": [c.claim.attempt for c in completions],
        "fences": [c.claim.fence for c in completions],
        "results": [c.result_json for c in completions],
    }


def claim_arrays(claims: Sequence[Claim]) -> dict[str, list[Any]]:
    """Parallel arrays of the claims' fences (start marks, row locks)."""
    return {
        "ids": [c.job_id for c in claims],
        "worker_ids": [c.worker_id for c in claims],
        "attempts": [c.attempt for c in claims],
        "fences": [c.fence for c in claims],
    }


def split_failures(failures: Sequence[Failure]) -> tuple[list[Failure], list[Failure]]:
    """Separate moves to the dead letters from in-place failure updates."""
    dead = [f for f in failures if f.outcome == FailureKind.DEAD]
    updates = [f for f in failures if f.outcome != FailureKind.DEAD]
    for failure in updates:
        if failure.outcome not in UPDATE_OUTCOMES:
            raise ValueError(f"unknown failure outcome {failure.outcome!r}")
    return dead, updates


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Consecutive slices of at most ``size`` items."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def epoch_to_datetime(value: Any) -> datetime | None:
    """SQLite stored seconds since the epoch (UTC) -> aware UTC datetime."""
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return (
            datetime.max.replace(tzinfo=UTC)
            if _is_large(value)
            else datetime.min.replace(tzinfo=UTC)
        )


def _is_large(value: Any) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False
