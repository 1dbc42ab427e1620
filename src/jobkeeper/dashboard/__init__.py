"""The web dashboard (``pip install 'jobkeeper[dashboard]'``).

``create_app(jq, read_only=False)`` returns an ASGI app: overview, jobs,
a job's page, dead letters, workers, actions by POST with a CSRF token, and
Prometheus text at ``/metrics``. ``jobkeeper dashboard`` serves it with
uvicorn.
"""

from __future__ import annotations

try:
    from jobkeeper.dashboard.app import create_app, is_loopback
    from jobkeeper.dashboard.nav import NAV, NavEntry
except ModuleNotFoundError as exc:
    # Whatever the dashboard imports from outside jobkeeper and the standard
    # library comes with its extra; without it the bare "No module named
    # 'jinja2'" did not say what to install. Still a ModuleNotFoundError
    # (an ImportError) with the missing module's name, for callers that
    # catch it.
    package = (exc.name or "jobkeeper").partition(".")[0]
    if package == "jobkeeper":
        raise
    raise ModuleNotFoundError(
        f"jobkeeper.dashboard needs the dashboard extra ({package} is not installed): "
        "pip install 'jobkeeper[dashboard]'",
        name=exc.name,
    ) from None

__all__ = ["NAV", "NavEntry", "create_app", "is_loopback"]
