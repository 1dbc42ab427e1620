"""The app the periodic e2e workers load:

    python -m jobkeeper --database URL worker --app tests.periodic.apps:jq

Settings come from ``$JK_E2E_SETTINGS`` (JobQueue keyword arguments, JSON),
as for tests/e2e/apps.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jobkeeper import JobQueue

SETTINGS: dict[str, Any] = json.loads(os.environ.get("JK_E2E_SETTINGS", "{}"))
jq = JobQueue(os.environ.get("JK_E2E_DATABASE", "sqlite:///unused-e2e.db"), **SETTINGS)


@jq.periodic(every=1)
@jq.task()
def beat() -> None:
    """Ticks every second."""


@jq.periodic("* * * * *", name="minutely")
@jq.task()
def minute() -> None:
    """The cron form: at each whole minute (UTC)."""
