"""Flow control helpers every backend shares (internal): rows of
``jobkeeper_queues``, the parameters of ``queue_configure``, and the
``max_pending`` judgement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from jobkeeper.errors import QueueFull
from jobkeeper.models import NewJob
from jobkeeper.queues import QueueSettings


def settings_from_row(row: Mapping[str, Any]) -> QueueSettings:
    """A ``jobkeeper_queues`` row as :class:`QueueSettings`."""
    return QueueSettings(
        name=row["name"],
        paused=bool(row["paused"]),
        concurrency=row["concurrency"],
        rate_limit=row["rate_limit"],
        rate_period=None if row["rate_period"] is None else float(row["rate_period"]),
        max_pending=None if row["max_pending"] is None else int(row["max_pending"]),
        serial=bool(row["serial"]),
    )


def configure_params(name: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``queue_configure`` (both backends): each setting in
    ``changes`` is written; the others keep their stored values.
    """
    rate = changes.get("rate_limit")
    return {
        "name": name,
        "set_paused": "paused" in changes,
        "paused": changes.get("paused"),
        "set_concurrency": "concurrency" in changes,
        "concurrency": changes.get("concurrency"),
        "set_rate": "rate_limit" in changes,
        "rate_limit": None if rate is None else rate[0],
        "rate_period": None if rate is None else rate[1],
        "set_max_pending": "max_pending" in changes,
        "max_pending": changes.get("max_pending"),
    }


def check_pending(
    limits: Mapping[str, int],
    counts: Mapping[str, int],
    jobs: Sequence[NewJob],
    *,
    inserted: bool = False,
) -> None:
    """Raise :class:`QueueFull` for the first queue (by name) that ``jobs``
    would take past its ``max_pending``. ``inserted``: ``counts`` already
    include ``jobs``, the rows the batch added (a job that resolved to its
    pending duplicate added none, so it is not among them).
    """
    adding = Counter(job.queue for job in jobs)
    for queue in sorted(limits):
        have = counts.get(queue, 0) - (adding[queue] if inserted else 0)
        if have + adding[queue] > limits[queue]:
            raise QueueFull(queue, limits[queue], have, adding[queue])
