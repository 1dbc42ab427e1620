"""The history checks of each job's final row: in the tables exactly once,
in the state its kind allows, dead before ``max_attempts`` only for the
soak's own faults, completed by its current holder alone, and never run
after it finished or without having been enqueued.
"""

from __future__ import annotations

from collections import defaultdict

from benchmarks.soak.check_context import CheckContext
from benchmarks.soak.records import (
    LOGGED,
    MUST_DIE,
    PENDING,
    TERMINAL,
    TOLERANCE,
    Row,
    faulted_at,
)
from benchmarks.soak.rescues import Rescues, rescues_of
from jobkeeper.verify.history import Execution


def check_tables(ctx: CheckContext) -> dict[int, Row]:
    rows: dict[int, Row] = {}
    by_token: dict[int, list[Row]] = defaultdict(list)
    for row in ctx.h.rows:
        if row.id in rows:
            ctx.flag(
                "duplicate_row",
                row.id,
                f"in the tables twice ({rows[row.id].status} and {row.status})",
            )
            continue
        rows[row.id] = row
        if row.token is not None:
            by_token[row.token].append(row)
    for token, same in by_token.items():
        if len(same) > 1:
            ids = sorted(r.id for r in same)
            ctx.flag("duplicate_row", ids[0], f"token {token} stored as jobs {ids}")
    known_tokens = {e.token for e in ctx.h.enqueued.values()} | set(ctx.h.ambiguous)
    for row in rows.values():
        expected = ctx.h.enqueued.get(row.id)
        if expected is None:
            if row.token is None or row.token not in known_tokens:
                ctx.flag("unknown_row", row.id, f"nobody enqueued it (token {row.token})")
            elif row.token not in ctx.h.ambiguous:
                ctx.flag("duplicate_row", row.id, f"second row for token {row.token}")
        elif row.token != expected.token:
            ctx.flag("unknown_row", row.id, f"holds token {row.token}, enqueued {expected.token}")
    lost = [job_id for job_id in ctx.h.enqueued if job_id not in rows]
    for job_id in lost:
        ctx.flag("lost", job_id, f"enqueued ({ctx.h.enqueued[job_id].kind}), in no table")
    ctx.stats["lost"] = len(lost)
    return rows


def check_states(
    ctx: CheckContext, rows: dict[int, Row], executions: dict[int, list[Execution]]
) -> None:
    for row in rows.values():
        kind = ctx.kind_of(row)
        if kind == "pending":
            if row.status not in PENDING:
                ctx.flag("pending_ran", row.id, f"left pending on purpose, is {row.status}")
            elif executions.get(row.id):
                ctx.flag("pending_ran", row.id, "left pending on purpose, but it ran")
            continue
        if row.status not in TERMINAL:
            holder = f" (held by {row.worker_id})" if row.worker_id else ""
            ctx.flag("not_terminal", row.id, f"ended the run {row.status}{holder}")
            continue
        if kind == "cancel" and row.status != "cancelled":
            ctx.flag("wrong_outcome", row.id, f"cancelled before it ran, is {row.status}")
        elif kind in MUST_DIE and row.status != "dead":
            ctx.flag("wrong_outcome", row.id, f"its task never succeeds, is {row.status}")
        elif row.status == "dead" and kind not in MUST_DIE and row.attempt < row.max_attempts:
            check_crash_budget(ctx, row, kind)
        if row.status == "dead" and not row.errors:
            ctx.flag("wrong_outcome", row.id, "dead letter without any error recorded")


def check_crash_budget(ctx: CheckContext, row: Row, kind: str | None) -> None:
    """A job whose task succeeds died before its ``max_attempts``: only
    the crash budget may do that, and only for crashes the soak caused.

    A crash is pinned on a job when its worker is lost while it runs
    alone (see :mod:`jobkeeper.maintenance.rescuer`); the rescuer cannot
    tell a poison job from a SIGKILL the soak sent, so an innocent
    suspect hit by faults in ``max_crashes`` of its lone attempts is
    dead letters by design. Each of its pinned crashes must be a rescue
    from a worker the soak had killed, stopped or cut off at that moment;
    one that is not (a poison job beside a lone attempt) is flagged.
    """
    pinned = rescues_of(row, pinned_only=True)
    if not pinned:
        ctx.flag(
            "wrong_outcome",
            row.id,
            f"dead after {row.attempt} of {row.max_attempts} attempts (kind {kind}), "
            "no crash pinned on it",
        )
        return
    for rescue in pinned:
        if not faulted_at(ctx.h.faulted, rescue.worker, rescue.at):
            ctx.flag(
                "wrong_outcome",
                row.id,
                f"dead after {row.attempt} of {row.max_attempts} attempts (kind {kind}): "
                f"a crash pinned on it at attempt {rescue.attempt} when its worker "
                f"{rescue.worker} was neither killed, stopped nor cut off by the soak",
            )
            return
    ctx.stats.setdefault("dead_for_faults", []).append(row.id)


def check_completions(
    ctx: CheckContext,
    rows: dict[int, Row],
    executions: dict[int, list[Execution]],
    rescues: Rescues,
) -> None:
    acks = ctx.acks_by_job
    for row in rows.values():
        runs = {run.key(): run for run in executions.get(row.id, [])}
        if row.finished_at is not None and row.status in TERMINAL:
            late = [r for r in runs.values() if r.start > row.finished_at + TOLERANCE]
            for stale in late:
                # A holder silenced (stopped, cut off) after its start
                # check calls the task when it resumes; its claim was
                # rescued and its ack is refused: a stale start, counted
                # in started_after_rescue.
                if rescues.of_run(stale) is not None:
                    continue
                ctx.flag(
                    "ran_after_finish",
                    row.id,
                    f"attempt {stale.attempt} on {stale.worker} started at {stale.start:.3f}, "
                    f"after the job was {row.status} at {row.finished_at:.3f}",
                )
        completions = [a for a in acks.get(row.id, []) if a.new_status == "completed"]
        if len(completions) > 1:
            writers = ", ".join(f"{a.worker}#{a.attempt}" for a in completions)
            ctx.flag("duplicate_completion", row.id, f"completed {len(completions)}x: {writers}")
        if row.status != "completed":
            if completions:
                ctx.flag(
                    "duplicate_completion",
                    row.id,
                    f"a completion was written but the job is {row.status}",
                )
            continue
        if ctx.h.acks is not None and not completions:
            ctx.flag("bad_completion", row.id, "completed without an audited completion")
        for ack in completions[:1]:
            if ack.attempt != row.attempt:
                ctx.flag(
                    "bad_completion",
                    row.id,
                    f"completion written for attempt {ack.attempt} by {ack.worker}, "
                    f"but the row is at attempt {row.attempt}",
                )
        if ctx.kind_of(row) not in LOGGED:
            continue
        result = row.result if isinstance(row.result, dict) else {}
        worker, attempt = result.get("worker"), result.get("attempt")
        fence = result.get("fence")
        if attempt != row.attempt or not isinstance(worker, str) or not isinstance(fence, int):
            ctx.flag(
                "bad_completion",
                row.id,
                f"result from {worker}#{attempt} (fence {fence}), but the row is at "
                f"attempt {row.attempt}",
            )
            continue
        if row.token is not None and result.get("n") != row.token:
            ctx.flag("bad_completion", row.id, f"result of token {result.get('n')}")
        run = runs.get((row.id, attempt, worker, fence))
        if run is None or run.outcome != "ok":
            state = "never ran" if run is None else f"ended {run.outcome or 'never'}"
            ctx.flag(
                "bad_completion",
                row.id,
                f"completed by {worker}#{attempt}, whose execution {state}",
            )
        if rescues.of(row.id, attempt, worker, fence) is not None:
            ctx.flag(
                "bad_completion",
                row.id,
                f"completed by {worker}#{attempt} (fence {fence}), whose claim had been rescued",
            )
        for ack in completions[:1]:
            if ack.worker != worker or ack.fence not in (None, fence):
                ctx.flag(
                    "bad_completion",
                    row.id,
                    f"result is {worker}'s (fence {fence}) but the completion was fenced "
                    f"on {ack.worker} (fence {ack.fence})",
                )
            if run is not None and run.end is not None and ack.at < run.end - TOLERANCE:
                ctx.flag("bad_completion", row.id, "completion written before the task ended")


def check_phantoms(
    ctx: CheckContext, rows: dict[int, Row], executions: dict[int, list[Execution]]
) -> None:
    for job in executions:
        if job not in rows and job not in ctx.h.enqueued:
            ctx.flag("phantom_execution", job, "executed, but no such job exists")
