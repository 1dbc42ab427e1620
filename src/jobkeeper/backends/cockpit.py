"""Reads of the dashboard, ``/metrics`` and ``doctor`` whose logic is the same
on every database (internal).

A backend mixes this in and supplies ``_fetch`` (a named query, rows as dicts
keyed by the column aliases) and ``_count_estimate``; only the SQL differs
and it lives in each backend's ``queries.sql`` under the method's name. None
of these reads grows with the completed rows kept for ``retention``: they use
the partial indexes of the live statuses, or stop at a cap.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jobkeeper.models import QueueCounts

#: The finished statuses that may hold more rows than the exact limit.
_CAPPED_STATUSES = ("completed", "cancelled")


class CockpitReads:
    """The dashboard's and doctor's operations of the Backend Protocol."""

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _count_estimate(self, status: str, cap: int, share: float) -> int | None:
        """An estimate of the rows of ``status`` (``"dead"``: the dead
        letters), asked only when more than ``cap`` finished rows (or dead
        letters) exist; ``share`` is the status's fraction of the capped
        sample. ``None`` when unknown.
        """
        raise NotImplementedError

    def _ids_param(self, job_ids: Sequence[int] | None) -> Any:
        raise NotImplementedError

    def queue_counts(self, *, exact_below: int) -> QueueCounts:
        counts: dict[str, dict[str, int]] = {}
        for row in self._fetch("queue_counts_live"):
            counts.setdefault(row["queue"], {})[row["status"]] = int(row["n"])
        estimated: set[str] = set()
        cap = exact_below + 1
        finished = self._fetch("queue_counts_finished", {"cap": cap})
        dead = self._fetch("queue_counts_dead", {"cap": cap})
        for rows, capped in ((finished, _CAPPED_STATUSES), (dead, ("dead",))):
            seen = {status: 0 for status in capped}
            for row in rows:
                seen[row.get("status", "dead")] += int(row["n"])
            total = sum(seen.values())
            scale = dict.fromkeys(capped, 1.0)
            if total > exact_below:
                # The sample stopped at the cap: scale each status's per-queue
                # split to an estimate of its whole (never below what was seen).
                for status, count in seen.items():
                    if count:
                        estimate = self._count_estimate(status, cap, count / total)
                        scale[status] = max(estimate or count, count) / count
                estimated.update(capped)
            for row in rows:
                status = row.get("status", "dead")
                counts.setdefault(row["queue"], {})[status] = round(int(row["n"]) * scale[status])
        return QueueCounts(counts=counts, estimated=frozenset(estimated))

    def queue_oldest_due(self) -> dict[str, tuple[int, float]]:
        return {
            row["queue"]: (int(row["id"]), max(float(row["age"]), 0.0))
            for row in self._fetch("queue_oldest_due")
        }

    def job_throughput(
        self, *, since_seconds: float, bucket_seconds: float
    ) -> dict[float, dict[str, int]]:
        rows = self._fetch("job_throughput", {"since": since_seconds, "bucket": bucket_seconds})
        out: dict[float, dict[str, int]] = {}
        for row in rows:
            out.setdefault(float(row["bucket"]), {})[row["status"]] = int(row["n"])
        return out

    def dead_letter_purge(
        self, *, job_ids: Sequence[int] | None, older_than: float | None
    ) -> list[int]:
        params = {
            "ids": self._ids_param(job_ids),
            "all_ids": job_ids is None,
            "older_than": older_than,
        }
        return sorted(int(row["id"]) for row in self._fetch("dead_letter_purge", params))

    def job_serial_holders(self, *, serial_key: str) -> list[int]:
        return [
            int(row["id"]) for row in self._fetch("job_serial_holders", {"serial_key": serial_key})
        ]

    def queue_starts_count(self, *, queue: str, period: float) -> int:
        rows = self._fetch("queue_starts_count", {"queue": queue, "period": period})
        return int(rows[0]["n"]) if rows else 0


def json_ids(job_ids: Sequence[int] | None) -> str:
    """Ids as a JSON array, for SQLite's ``json_each``."""
    return json.dumps(list(job_ids or []))
