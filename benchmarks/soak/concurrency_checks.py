"""The history checks of what ran at once: two executions of one job only
after a rescue of a silent holder (``overlap``), never more executions of a
capped queue than its concurrency (``cap_exceeded``), never two jobs of one
serial key (``serial_overlap``).
"""

from __future__ import annotations

import math
from collections import defaultdict

from benchmarks.soak.check_context import CheckContext
from benchmarks.soak.records import TOLERANCE, Row
from benchmarks.soak.rescues import Rescues
from jobkeeper.verify.history import Execution


def check_overlaps(
    ctx: CheckContext,
    executions: dict[int, list[Execution]],
    rescues: Rescues,
) -> None:
    justified = unjustified = stale_starts = 0
    for job, runs in executions.items():
        for i, a in enumerate(runs):
            end_a = ctx.effective_end(a)
            for b in runs[i + 1 :]:
                if b.start >= end_a - TOLERANCE:
                    continue
                # The first holder is the earlier claim: the lower fence
                # (attempts start again at a requeue; fences never do), or
                # the lower attempt where the log has no fences.
                first, second = (a, b) if _order(a) <= _order(b) else (b, a)
                reason = overlap_unjustified(ctx, first, second, rescues)
                if reason is None:
                    justified += 1
                else:
                    unjustified += 1
                    ctx.flag(
                        "overlap",
                        job,
                        f"attempt {first.attempt} on {first.worker} "
                        f"[{first.start:.3f}, {ctx.effective_end(first):.3f}] overlapped "
                        f"attempt {second.attempt} on {second.worker} from "
                        f"{second.start:.3f}: {reason}",
                    )
        for run in runs:
            rescue = rescues.of_run(run)
            if rescue is not None and run.start > rescue.at + TOLERANCE:
                stale_starts += 1
    ctx.stats["overlaps_justified"] = justified
    ctx.stats["duplicates"] = unjustified
    ctx.stats["started_after_rescue"] = stale_starts


def _order(run: Execution) -> tuple[int, int, float]:
    return (run.fence, run.attempt, run.start)


def overlap_unjustified(
    ctx: CheckContext,
    first: Execution,
    second: Execution,
    rescues: Rescues,
) -> str | None:
    rescue = rescues.of_run(first)
    if rescue is None:
        return "the first holder's attempt was never rescued (two live holders); " + (
            _release_of(ctx, first)
        )
    if rescue.at > second.start + TOLERANCE:
        return f"the second started before the rescue at {rescue.at:.3f}"
    if ctx.hb is not None:
        silent = ctx.silent_for(first.worker, rescue.at)
        if silent < ctx.h.rescue_after - TOLERANCE:
            return f"the first holder had heartbeaten {silent:.3f}s before the rescue"
    return None


def _release_of(ctx: CheckContext, run: Execution) -> str:
    """What the ack audit says took ``run``'s claim out of claimed/running
    (a write not counted as a rescue: by the holder itself, or a free return
    while its heartbeats say it was alive), so an unjustified overlap names
    its cause.
    """
    writes = [
        ack
        for ack in ctx.h.acks or []
        if (ack.job, ack.attempt, ack.worker) == (run.job, run.attempt, run.worker)
        and (run.fence is None or ack.fence in (None, run.fence))
    ]
    if not writes:
        return "no audited write released its claim" if ctx.h.acks else "no ack audit"
    parts = []
    for ack in sorted(writes, key=lambda ack: ack.at):
        silent = ctx.silent_for(run.worker, ack.at) if ctx.hb is not None else math.nan
        parts.append(
            f"its claim went {ack.new_status} at {ack.at:.3f}, the holder's last heartbeat "
            f"{silent:.3f}s before"
        )
    return "; ".join(parts)


def held_span(ctx: CheckContext, run: Execution, rescues: Rescues) -> tuple[float, float]:
    """When an execution counted against its queue's limits: from its
    start to its end (or its process's death), cut at the rescue of its
    claim. From the rescue on the database no longer counts it (the slot
    and the serial key are free again) while a stopped holder's code may
    still be frozen mid-run: that overlap is the justified kind.
    """
    end = ctx.effective_end(run)
    rescue = rescues.of_run(run)
    if rescue is not None:
        end = min(end, rescue.at - TOLERANCE)
    return run.start, end


def check_limits(
    ctx: CheckContext,
    rows: dict[int, Row],
    executions: dict[int, list[Execution]],
    rescues: Rescues,
) -> None:
    """Queue caps (``cap_exceeded``) and serial keys (``serial_overlap``),
    as the execution log saw them.
    """
    by_queue: dict[str, list[tuple[float, float, Execution]]] = defaultdict(list)
    by_key: dict[str, list[tuple[float, float, Execution]]] = defaultdict(list)
    starts: dict[str, list[float]] = defaultdict(list)
    for job, runs in executions.items():
        row = rows.get(job)
        if row is None:
            continue
        for run in runs:
            if row.queue in ctx.h.rate_limits:
                starts[row.queue].append(run.start)
            start, end = held_span(ctx, run, rescues)
            if end <= start:
                continue
            if row.queue in ctx.h.caps:
                by_queue[row.queue].append((start, end, run))
            if row.serial_key is not None:
                by_key[row.serial_key].append((start, end, run))
    most_running: dict[str, int] = {}
    for queue, cap in sorted(ctx.h.caps.items()):
        # Ends before starts at the same instant: a slot freed and taken.
        moments = sorted(
            [(start, 1, run) for start, _, run in by_queue[queue]]
            + [(end, -1, run) for _, end, run in by_queue[queue]],
            key=lambda m: (m[0], m[1]),
        )
        active: set[tuple[int, int, str, int]] = set()
        best = 0
        for at, step, run in moments:
            if step > 0:
                active.add(run.key())
                if len(active) == cap + 1:  # once per excess, not per start
                    shown = ", ".join(f"{j}#{a}@{w}" for j, a, w, _ in sorted(active))
                    ctx.flag(
                        "cap_exceeded",
                        run.job,
                        f"queue {queue!r} (concurrency {cap}) ran {len(active)} at "
                        f"{at:.3f}: {shown}",
                    )
            else:
                active.discard(run.key())
            best = max(best, len(active))
        most_running[queue] = best
    overlaps = 0
    for key, spans in sorted(by_key.items()):
        spans.sort(key=lambda span: span[0])
        holder: tuple[float, float, Execution] | None = None
        for span in spans:
            start, end, run = span
            if holder is not None and run.job != holder[2].job and start < holder[1] - TOLERANCE:
                overlaps += 1
                other = holder[2]
                ctx.flag(
                    "serial_overlap",
                    run.job,
                    f"serial key {key!r}: attempt {run.attempt} on {run.worker} started at "
                    f"{start:.3f} while job {other.job} attempt {other.attempt} on "
                    f"{other.worker} ran [{holder[0]:.3f}, {holder[1]:.3f}]",
                )
            if holder is None or end > holder[1]:
                holder = span
    most_starts: dict[str, tuple[int, int]] = {}
    for queue, (count, period) in sorted(ctx.h.rate_limits.items()):
        times = sorted(starts[queue])
        best, lo = 0, 0
        for hi, at in enumerate(times):
            while times[lo] <= at - period:
                lo += 1
            best = max(best, hi - lo + 1)
        most_starts[queue] = (best, count)
    ctx.stats["most_running"] = most_running
    ctx.stats["serial_keys"] = len(by_key)
    ctx.stats["serial_overlaps"] = overlaps
    ctx.stats["most_starts_in_a_window"] = most_starts
