"""The claim's rows: ``job_claim`` returns only what the worker does not
already know, positionally, and :func:`claimed_job` builds each Job from one
(the worker's hottest read, see the query's comment).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jobkeeper.frozen import frozen_builder
from jobkeeper.models import Job, JobStatus
from jobkeeper.payload import decode_args

_JSON = json.JSONDecoder()
#: Job's constructor without the frozen ``__init__``'s keyword binding (see
#: frozen_builder): a claim builds one Job per row.
_claimed = frozen_builder(
    Job,
    ("id", "task", "args", "queue", "status", "priority", "attempt", "max_attempts",
     "scheduled_at", "created_at", "attempted_at", "worker_id", "unique_key", "errors",
     "args_error", "fence", "unstarted_returns", "trace_context", "run_alone"),
)  # fmt: skip


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
    return _claimed(
        job_id,
        task,
        args,
        queue,
        JobStatus.CLAIMED,
        priority,
        attempt,
        max_attempts,
        aware[0],
        aware[1],
        aware[2],
        worker_id,
        unique_key,
        errors if isinstance(errors, list) else [],
        args_error,
        fence,
        unstarted_returns,
        trace_context,
        bool(run_alone),
    )
