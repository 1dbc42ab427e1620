"""Helpers of the periodic tests: a service on a queue's periodics, rows
fabricated in the past (as River's testfactory fabricates jobs), jobs by tick.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from jobkeeper import JobQueue
from jobkeeper.maintenance.periodic import PeriodicEnqueuer
from support.db import is_pg, sql


def stored(url: str, value: datetime | None) -> Any:
    """A datetime as the backend stores it."""
    if value is None or is_pg(url):
        return value
    return value.timestamp()


def loaded(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromtimestamp(float(value), UTC)


def fabricate(url: str, name: str, **times: datetime | None) -> None:
    """Set ``since_at``, ``last_tick_at``, ``seen_at`` ... of a periodic row."""
    assignments = ", ".join(f"{column} = ?" for column in times)
    params = [stored(url, value) for value in times.values()]
    sql(url, f"UPDATE jobkeeper_periodic SET {assignments} WHERE name = ?", [*params, name])


def ticks(url: str, task: str | None = None) -> list[datetime]:
    """``scheduled_at`` of the jobs (of ``task``), in id order."""
    rows = sql(url, "SELECT task, scheduled_at FROM jobkeeper_jobs ORDER BY id")
    return [loaded(at) for name, at in rows if task is None or name == task]


def per_task(url: str) -> Counter[str]:
    return Counter(str(row[0]) for row in sql(url, "SELECT task FROM jobkeeper_jobs"))


#: What the tests opened; closed after each test (tests/periodic/conftest.py).
OPENED: list[Any] = []


def service(jq: JobQueue, **options: Any) -> PeriodicEnqueuer:
    """A periodic enqueuer for ``jq``'s periodics (what each worker runs)."""
    backend = jq.backend.dedicated()
    OPENED.append(backend)
    # Missed ticks judged at once (a test's clock is pinned, not waited for).
    options.setdefault("judge_after", 0.0)
    return PeriodicEnqueuer(backend, list(jq.periodics.values()), **options)


def app(url: str, **periodic: Any) -> JobQueue:
    """Another app (another deploy) with one periodic, on the same database."""
    other = JobQueue(url)
    OPENED.append(other)
    other.periodic(**periodic)
    return other


def close_opened() -> None:
    while OPENED:
        OPENED.pop().close()


def aligned(now: datetime, every: int, offset: float) -> datetime:
    """The instant ``offset`` seconds after the last multiple of ``every`` s before ``now``."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    whole = (now - epoch) // timedelta(seconds=every)
    return epoch + timedelta(seconds=whole * every + offset)
