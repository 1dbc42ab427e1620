"""What the dashboard reads from a request's path and query: job ids."""

from __future__ import annotations

from starlette.requests import Request

from jobkeeper.config import parse_whole_number
from jobkeeper.models import MAX_JOB_ID


def path_job_id(request: Request) -> int | None:
    """The URL's job id, or None when it is not one (a positive whole number)."""
    return job_id_of(request.path_params["job_id"])


def job_id_of(raw: object) -> int | None:
    """``raw`` as a job id, or None when it is not one (see
    :func:`~jobkeeper.config.parse_whole_number`).
    """
    try:
        job_id = parse_whole_number(raw) if isinstance(raw, str) else 0
    except ValueError:
        return None
    return job_id if 0 < job_id <= MAX_JOB_ID else None
