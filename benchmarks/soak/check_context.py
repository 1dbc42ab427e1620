"""What every check of the soak's history shares: the history, indexed for
the look-ups the checks repeat, and the violations and statistics they
collect into one report.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from benchmarks.soak.records import TOLERANCE, Ack, History, Row
from jobkeeper.verify.history import Execution, Violation


class CheckContext:
    def __init__(self, history: History) -> None:
        self.h = history
        self.violations: list[Violation] = []
        self.stats: dict[str, Any] = {}
        self.hb: dict[str, list[float]] | None = (
            {w: sorted(ts) for w, ts in history.heartbeats.items()}
            if history.heartbeats is not None
            else None
        )
        self.acks_by_job: dict[int, list[Ack]] = defaultdict(list)
        for ack in history.acks or []:
            self.acks_by_job[ack.job].append(ack)

    def flag(self, kind: str, job: int | None, detail: str) -> None:
        self.violations.append(Violation(kind, job, detail))

    def silent_for(self, worker: str, at: float) -> float:
        """Seconds since ``worker``'s last heartbeat at or before ``at`` (inf: none)."""
        assert self.hb is not None
        beats = self.hb.get(worker, [])
        lo, hi = 0, len(beats)
        while lo < hi:
            mid = (lo + hi) // 2
            if beats[mid] <= at:
                lo = mid + 1
            else:
                hi = mid
        return at - beats[lo - 1] if lo else math.inf

    def effective_end(self, execution: Execution) -> float:
        """When an execution stopped: its end event, else its process's death."""
        if execution.end is not None:
            return execution.end
        death = self.h.deaths.get(execution.worker)
        if death is not None and death >= execution.start - TOLERANCE:
            return death
        return math.inf

    def kind_of(self, row: Row) -> str | None:
        expected = self.h.enqueued.get(row.id)
        if expected is not None:
            return expected.kind
        return self.h.ambiguous.get(row.token) if row.token is not None else None
