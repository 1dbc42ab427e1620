"""The dashboard's actions on one job or dead letter (internal)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from jobkeeper.dashboard.params import path_job_id
from jobkeeper.errors import ConfigError, JobkeeperError, JobNotFound, JobStateError
from jobkeeper.models import JobStatus

if TYPE_CHECKING:
    from jobkeeper.dashboard.app import Dashboard


def no_such_id(dashboard: Dashboard, request: Request) -> Response:
    """The 404 of a path whose job id is not a positive number."""
    return dashboard.error(
        request, 404, f"No job {request.path_params['job_id']!r}: a job id is a positive number."
    )


#: A page's fence or count of errors: a whole number (the form's text).
_COUNT = re.compile(r"[0-9]{1,18}")


def act_on_job(
    dashboard: Dashboard, request: Request, *, seen: dict[str, str] | None = None
) -> Response:
    """A job page's action (retry, cancel) or a dead letter's (requeue,
    delete), answered with a redirect to the page that shows its outcome, or
    an error page. ``seen``: what the page showed of the job (form fields
    ``seen``, its status; ``seen_fence``; ``seen_errors``, how many errors
    it had), which a retry requires still: a job that completed since, or
    ran again and completed again, is not run again.
    """
    seen = seen or {}
    counts: dict[str, int] = {}
    for name in ("seen_fence", "seen_errors"):
        if name in seen:
            if not _COUNT.fullmatch(seen[name]):
                return dashboard.error(
                    request, 400, f"The form's {name} is not a whole number: {seen[name]!r}."
                )
            counts[name] = int(seen[name])
    what = request.path_params["action"]
    kind = request.path_params["kind"]
    job_id = path_job_id(request)
    if job_id is None:
        return no_such_id(dashboard, request)
    try:
        if kind == "jobs" and what == "retry":
            errors = counts.get("seen_errors")
            job_now = dashboard.jq.get_job(job_id) if errors is not None else None
            if job_now is not None and errors is not None and len(job_now.errors) != errors:
                # Through the dead letters and back by a release before schema
                # version 18, whose requeue started the fence again at 0.
                raise JobStateError(
                    f"job {job_id} has {len(job_now.errors)} errors, not the page's {errors}: "
                    "it ran again since, and nothing was changed"
                )
            dashboard.jq.retry(
                job_id, if_status=seen.get("seen"), if_fence=counts.get("seen_fence")
            )
            message = f"Job {job_id} is available again."
        elif kind == "jobs" and what == "cancel":
            job = dashboard.jq.cancel(job_id)
            message = (
                f"Job {job_id} cancelled."
                if job.status == JobStatus.CANCELLED
                else f"Job {job_id} is running: its worker was asked to stop it."
            )
        elif kind == "dead" and what == "requeue":
            if not dashboard.jq.requeue_dead([job_id]):
                return _not_dead(dashboard, request, job_id)
            message = f"Dead letter {job_id} requeued."
        elif kind == "dead" and what == "delete":
            if not dashboard.jq.purge_dead([job_id]):
                return _not_dead(dashboard, request, job_id)
            message = f"Dead letter {job_id} deleted."
            return dashboard.see_other(request, "/dead", message)
        else:
            return PlainTextResponse("unknown action\n", status_code=404)
    except JobNotFound as exc:
        return dashboard.error(request, 404, str(exc))
    except (JobStateError, ConfigError) as exc:
        return dashboard.error(request, 409, str(exc))
    except JobkeeperError as exc:
        return dashboard.error(request, 503, str(exc))
    return dashboard.see_other(request, f"/jobs/{job_id}", message)


def _not_dead(dashboard: Dashboard, request: Request, job_id: int) -> Response:
    """A dead-letter action on one that is gone: requeued or retried since
    (say what the job is now), or deleted.
    """
    job = dashboard.jq.get_job(job_id)
    if job is None:
        return dashboard.error(request, 404, f"No dead letter {job_id}.")
    return dashboard.error(
        request,
        409,
        f"Job {job_id} is no longer a dead letter: it is {job.status.value} now "
        "(requeued since); nothing was changed.",
    )
