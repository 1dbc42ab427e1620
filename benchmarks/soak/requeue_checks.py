"""The history checks of claim numbers (fences) and of the dead letters'
way back: every claim of a job is numbered above every earlier one, across
requeues too (schema version 18: a requeue goes on from the dead letter's
fence); a job leaves the dead letters only when requeued, and every
confirmed requeue is followed by a run or a new end; the final row agrees
with the job's last claim.

A fence of 0 in the log (or a row's ``None``) is "not recorded" (hand-made
histories): a real claim is numbered from 1. So where the row's fence was
read (a real run), an execution logged under a number below 1 is flagged
(``fence_missing``): a bug that numbered claims from 0 would otherwise pass
every fence check.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from benchmarks.soak.check_context import CheckContext
from benchmarks.soak.records import LOGGED, TERMINAL, TOLERANCE, Requeue, Row
from benchmarks.soak.rescues import Rescues
from jobkeeper.verify.history import Execution


def _stale(run: Execution, rescues: Rescues, before: float) -> bool:
    """Whether ``run`` started after its claim had been rescued (or given
    back), the rescue at or before ``before``: a paused holder that passed
    its start check runs late; its claim is an old one.
    """
    rescue = rescues.of_run(run)
    return rescue is not None and rescue.at <= min(run.start, before) + TOLERANCE


def check_fences(
    ctx: CheckContext,
    rows: dict[int, Row],
    executions: dict[int, list[Execution]],
    rescues: Rescues,
) -> None:
    """``fence_reused``: two executions of a job under one claim number (a
    claim calls its task once); ``fence_not_increasing``: an execution that
    started after another under a lower number, unless its own claim had
    been rescued by then; ``final_row_mismatch``: an execution numbered
    above the row's fence, a completion by a claim other than the last, a
    dead row whose last claim ended ``ok`` and was never rescued.
    """
    starts = Counter(e.key() for e in ctx.h.events if e.kind == "S" and e.fence > 0)
    for (job, attempt, worker, fence), count in sorted(starts.items()):
        if count > 1:
            ctx.flag(
                "fence_reused",
                job,
                f"attempt {attempt} on {worker} under fence {fence} started {count} times",
            )
    for job, runs in executions.items():
        row = rows.get(job)
        if row is not None and row.fence is not None:
            for run in runs:
                if run.fence < 1:
                    ctx.flag(
                        "fence_missing",
                        job,
                        f"attempt {run.attempt} on {run.worker} ran under fence {run.fence} "
                        "(real claims are numbered from 1)",
                    )
        fenced = [run for run in runs if run.fence > 0]
        by_fence: dict[int, set[tuple[int, str]]] = defaultdict(set)
        for run in fenced:
            by_fence[run.fence].add((run.attempt, run.worker))
        for fence, holders in sorted(by_fence.items()):
            if len(holders) > 1:
                shown = ", ".join(f"attempt {a} on {w}" for a, w in sorted(holders))
                ctx.flag("fence_reused", job, f"fence {fence} numbers {shown}")
        top: Execution | None = None  # the highest-numbered claim started so far
        for run in fenced:  # in start order
            if top is not None and run.fence < top.fence and not _stale(run, rescues, top.start):
                ctx.flag(
                    "fence_not_increasing",
                    job,
                    f"attempt {run.attempt} on {run.worker} started at {run.start:.3f} under "
                    f"fence {run.fence}, after attempt {top.attempt} on {top.worker} had "
                    f"started at {top.start:.3f} under fence {top.fence}, and its claim "
                    "was never rescued",
                )
            if top is None or run.fence > top.fence:
                top = run
        row = rows.get(job)
        if row is not None and fenced:
            _check_final_row(ctx, row, fenced, rescues)


def _check_final_row(
    ctx: CheckContext, row: Row, fenced: list[Execution], rescues: Rescues
) -> None:
    last = max(fenced, key=lambda run: run.fence)
    if row.fence is not None and last.fence > row.fence:
        ctx.flag(
            "final_row_mismatch",
            row.id,
            f"the row is {row.status} at fence {row.fence}, but attempt {last.attempt} on "
            f"{last.worker} ran under fence {last.fence}",
        )
    if row.status == "completed" and isinstance(row.result, dict):
        fence = row.result.get("fence")
        if isinstance(fence, int) and fence > 0:
            if fence < last.fence:
                ctx.flag(
                    "final_row_mismatch",
                    row.id,
                    f"completed under fence {fence}, but a later claim ran (fence "
                    f"{last.fence}, attempt {last.attempt} on {last.worker})",
                )
            if row.fence is not None and fence != row.fence:
                ctx.flag(
                    "final_row_mismatch",
                    row.id,
                    f"completed under fence {fence}, but the row is at fence {row.fence}",
                )
    if (
        row.status == "dead"
        and ctx.kind_of(row) in LOGGED
        and last.outcome == "ok"
        and rescues.of_run(last) is None
    ):
        ctx.flag(
            "final_row_mismatch",
            row.id,
            f"dead, but its last claim (attempt {last.attempt} on {last.worker}, fence "
            f"{last.fence}) ended ok and was never rescued",
        )


def check_requeues(
    ctx: CheckContext,
    rows: dict[int, Row],
    executions: dict[int, list[Execution]],
    rescues: Rescues,
) -> None:
    """``requeue_lost``: a confirmed requeue followed by neither a run nor a
    new end of the job; ``dead_letter_accounting``: a job that left the dead
    letters (a move there, by the ack audit, that its final state does not
    account for) more often than it was requeued (confirmed or maybe), or
    less often than confirmed; ``ran_after_finish``: a run that started
    while the job was in the dead letters, between a move there and the
    requeue that followed.
    """
    by_job: dict[int, list[Requeue]] = defaultdict(list)
    for requeue in ctx.h.requeues:
        by_job[requeue.job].append(requeue)
    confirmed_jobs = 0
    for job, requeues in by_job.items():
        row = rows.get(job)
        runs = executions.get(job, [])
        confirmed = [r for r in requeues if r.confirmed]
        confirmed_jobs += bool(confirmed)
        for requeue in confirmed:
            ended_after = (
                row is not None
                and row.status in TERMINAL
                and row.finished_at is not None
                and row.finished_at >= requeue.began - TOLERANCE
            )
            ran_after = any(
                run.start >= requeue.began - TOLERANCE and not _stale(run, rescues, run.start)
                for run in runs
            )
            if not (ended_after or ran_after):
                final = "no row" if row is None else f"{row.status} at {row.finished_at}"
                ctx.flag(
                    "requeue_lost",
                    job,
                    f"requeued ({requeue.way}) at {requeue.began:.3f}, then never ran nor "
                    f"ended again (final: {final})",
                )
    if ctx.h.acks is not None:
        for job, row in rows.items():
            requeued, runs = by_job.get(job, []), executions.get(job, [])
            _check_dead_letter_moves(ctx, row, requeued, runs, rescues)
    ctx.stats["requeued_jobs"] = confirmed_jobs


def _check_dead_letter_moves(
    ctx: CheckContext,
    row: Row,
    requeues: list[Requeue],
    runs: list[Execution],
    rescues: Rescues,
) -> None:
    moves = sorted(a.at for a in ctx.acks_by_job.get(row.id, []) if a.new_status == "removed")
    came_back = len(moves) - (row.status == "dead")
    confirmed = sum(r.confirmed for r in requeues)
    if not confirmed <= came_back <= len(requeues):
        ctx.flag(
            "dead_letter_accounting",
            row.id,
            f"moved to the dead letters {len(moves)} times and is {row.status}: it came back "
            f"{came_back} times, requeued {confirmed} times (+{len(requeues) - confirmed} maybe)",
        )
    # While dead: from each move there until the next requeue call began
    # (the first one, confirmed or not: that one may have moved it).
    calls = sorted(r.began for r in requeues)
    for moved_at in moves:
        later = [t for t in calls if t >= moved_at - TOLERANCE]
        if not later:
            continue  # dead to the end: ran_after_finish (job_checks) holds that span
        for run in runs:
            if moved_at + TOLERANCE < run.start < later[0] - TOLERANCE and not _stale(
                run, rescues, run.start
            ):
                ctx.flag(
                    "ran_after_finish",
                    row.id,
                    f"attempt {run.attempt} on {run.worker} started at {run.start:.3f}, while "
                    f"the job was in the dead letters (moved there at {moved_at:.3f}, "
                    f"requeued at {later[0]:.3f})",
                )
