"""Rescues in the soak's history: the records a rescuer leaves in a row's
errors, the index of rescued claims that the overlap, limit and completion
checks consult, and the check that no rescue took a job from a live holder
(``rescued_live_holder``).
"""

from __future__ import annotations

import dataclasses
import math
import re

from benchmarks.soak.check_context import CheckContext
from benchmarks.soak.records import TOLERANCE, Row, parse_db_time
from jobkeeper.verify.history import Execution

_RESCUE = re.compile(r"worker lost: (\S+) sent no heartbeat")
#: In a rescue record whose crash was pinned on the job.
_PINNED = ", alone: crashed its worker "


@dataclasses.dataclass(frozen=True, slots=True)
class Rescue:
    job: int
    attempt: int
    worker: str
    at: float
    fence: int | None = None  # None: not known (no ack audit)


def rescues_of(row: Row, *, pinned_only: bool = False) -> list[Rescue]:
    """The rescue records in a row's ``errors`` (written by the rescuer);
    ``pinned_only``: those that pinned a crash on the job (a lone attempt).
    """
    found = []
    for entry in row.errors:
        if not isinstance(entry, dict):
            continue
        error = str(entry.get("error") or "")
        if pinned_only and _PINNED not in error:
            continue
        match = _RESCUE.match(error)
        at = parse_db_time(entry.get("at"))
        if match and at is not None:
            found.append(Rescue(row.id, int(entry.get("attempt") or 0), match.group(1), at))
    return found


class Rescues:
    """Rescued claims, found by the execution that held them.

    A claim is ``(job, attempt, worker, fence)``. A rescue record in a row's
    errors names no fence; the ack audit's write for the same holder gives
    it. Without the audit a rescue matches any fence of that holder.
    """

    def __init__(self) -> None:
        self._by_claim: dict[tuple[int, int, str, int | None], Rescue] = {}

    def add(self, rescue: Rescue) -> None:
        self._by_claim[(rescue.job, rescue.attempt, rescue.worker, rescue.fence)] = rescue

    def of(self, job: int, attempt: int, worker: str, fence: int | None) -> Rescue | None:
        """The rescue of that claim, if it was rescued."""
        found = self._by_claim.get((job, attempt, worker, fence))
        if found is None and fence is not None:
            found = self._by_claim.get((job, attempt, worker, None))
        return found

    def of_run(self, run: Execution) -> Rescue | None:
        return self.of(run.job, run.attempt, run.worker, run.fence)

    def __len__(self) -> int:
        return len(self._by_claim)


def fence_of(ctx: CheckContext, rescue: Rescue) -> int | None:
    """The fence of the claim a rescue record took: from the audited
    write of that holder's attempt nearest in time (None: no audit).
    """
    writes = [
        ack
        for ack in ctx.acks_by_job.get(rescue.job, [])
        if (ack.attempt, ack.worker) == (rescue.attempt, rescue.worker)
        and ack.new_status != "completed"
    ]
    if not writes:
        return None
    return min(writes, key=lambda ack: abs(ack.at - rescue.at)).fence


def check_rescues(ctx: CheckContext, rows: dict[int, Row]) -> Rescues:
    rescues = Rescues()
    since_heartbeat: list[float] = []
    since_death: list[float] = []
    for row in rows.values():
        for record in rescues_of(row):
            rescue = dataclasses.replace(record, fence=fence_of(ctx, record))
            rescues.add(rescue)
            if ctx.hb is not None:
                silent = ctx.silent_for(rescue.worker, rescue.at)
                if silent < ctx.h.rescue_after - TOLERANCE:
                    ctx.flag(
                        "rescued_live_holder",
                        rescue.job,
                        f"attempt {rescue.attempt} rescued from {rescue.worker}, which had "
                        f"heartbeaten {silent:.3f}s before (rescue_after="
                        f"{ctx.h.rescue_after:g}s)",
                    )
                elif math.isfinite(silent):
                    since_heartbeat.append(silent)
            death = ctx.h.deaths.get(rescue.worker)
            if death is not None and death <= rescue.at + TOLERANCE:
                since_death.append(rescue.at - death)
    # A holder silent past rescue_after whose job was still `claimed` in
    # the database (its start mark is batched, so a job that had started
    # may look unstarted) is given back free: available, the attempt not
    # spent, no errors entry. The ack audit is its only record; the next
    # holder runs the same attempt number. A hand-back by a live holder
    # (a graceful stop) looks the same there, but it had heartbeaten.
    free_returns = 0
    if ctx.hb is not None:
        for ack in ctx.h.acks or []:
            if ack.new_status != "available":
                continue
            if rescues.of(ack.job, ack.attempt, ack.worker, ack.fence) is not None:
                continue
            if ctx.silent_for(ack.worker, ack.at) >= ctx.h.rescue_after - TOLERANCE:
                rescues.add(Rescue(ack.job, ack.attempt, ack.worker, ack.at, ack.fence))
                free_returns += 1
    ctx.stats["free_returns"] = free_returns
    ctx.stats["rescues"] = len(rescues) - free_returns
    ctx.stats["rescue_after_last_heartbeat_s"] = since_heartbeat
    ctx.stats["rescue_after_kill_s"] = since_death
    return rescues
