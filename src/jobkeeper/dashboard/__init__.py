"""The web dashboard (``pip install 'jobkeeper[dashboard]'``).

``create_app(jq, read_only=False)`` returns an ASGI app: overview, jobs,
a job's page, dead letters, workers, actions by POST with a CSRF token, and
Prometheus text at ``/metrics``. ``jobkeeper dashboard`` serves it with
uvicorn.
"""

from __future__ import annotations

from jobkeeper.dashboard.app import create_app, is_loopback
from jobkeeper.dashboard.nav import NAV, NavEntry

__all__ = ["NAV", "NavEntry", "create_app", "is_loopback"]
