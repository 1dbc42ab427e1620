"""The claim's rows: ``job_claim`` returns only what the worker does not
already know, positionally, and :func:`claimed_job` builds each Job from one
(the worker's hottest read, see the query's comment).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jobkeeper.models import Job, JobStatus
from jobkeeper.payload import decode_args

_JSON = json.JSONDecoder()


def claimed_job(row: tuple[Any, ...], worker_id: str, utc: dict[datetime, datetime]) -> Job:
    """A Job from one row of ``job_claim``'s RETURNING list (positional).

    The rest is known: the job is claimed, held by ``worker_id``, has no
    result, and no cancel was asked (a cancel flags only held jobs, and
    cancels an available one outright).
    Args are checked by :func:`decode_args` (PostgreSQL's json type accepts
    a ``\\u0000`` escape that enqueue would refuse).

    ``utc`` memoises naive UTC -> aware for one claim's rows: every row
    shares ``attempted_at`` (the claim's ``now()``), ``scheduled_at`` usually
    equals ``created_at``, and jobs enqueued together share both, so most
    ``replace`` calls (a third of this function's time) become dict hits.
    """
    (job_id, queue, task, args_text, priority, attempt, max_attempts,
     scheduled_at, created_at, attempted_at, unique_key, errors_text, fence,
     unstarted_returns, trace_context, run_alone) = row  # fmt: skip
    args, args_error = decode_args(args_text)
    try:
        errors = [] if errors_text is None else _JSON.decode(errors_text)
    except (ValueError, RecursionError):  # written by hand: the claim must not fail
        errors = []
    aware = []
    for naive in (scheduled_at, created_at, attempted_at):
        value = utc.get(naive)
        if value is None:
            value = utc[naive] = naive.replace(tzinfo=UTC)
        aware.append(value)
    return Job(
        id=job_id,
        task=task,
        args=args,
        queue=queue,
        status=JobStatus.CLAIMED,
        priority=priority,
        attempt=attempt,
        max_attempts=max_attempts,
        scheduled_at=aware[0],
        created_at=aware[1],
        attempted_at=aware[2],
        worker_id=worker_id,
        unique_key=unique_key,
        errors=errors if isinstance(errors, list) else [],
        args_error=args_error,
        fence=fence,
        unstarted_returns=unstarted_returns,
        trace_context=trace_context,
        run_alone=bool(run_alone),
    )
