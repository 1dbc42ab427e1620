"""The dashboard's navigation bar: an extension point. A page that depends
on an API a later version adds ("queues" with pause/resume, "schedules" for
periodic jobs) registers a :class:`NavEntry` whose ``available`` test looks
for that API, and its routes in :func:`jobkeeper.dashboard.app.create_app`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jobkeeper.api import JobQueue


@dataclasses.dataclass(frozen=True)
class NavEntry:
    """A page in the navigation bar.

    Attributes:
        label: what the link says.
        path: where it goes.
        available: whether the queue's API offers what the page needs (so a
            page for an API a later version adds appears once it exists).
    """

    label: str
    path: str
    available: Callable[[JobQueue], bool] = lambda jq: True


#: The navigation bar.
NAV: list[NavEntry] = [
    NavEntry("Overview", "/"),
    NavEntry("Jobs", "/jobs"),
    NavEntry("Dead letters", "/dead"),
    NavEntry("Queues", "/queues"),
    NavEntry("Periodic", "/periodic"),
    NavEntry("Workers", "/workers"),
]
