"""The soak's history: an execution log written by the tasks, and a checker
that verifies it together with the final tables (Jepsen-style: the whole
history is checked, not single outcomes).

The log
    Every soak task appends ``start`` and ``end`` events to a per-process file
    opened with ``O_APPEND`` (one ``write(2)`` per event, so events are whole
    lines even when the process is SIGKILLed, and the log never depends on
    the database being up). An execution is identified by
    ``(job, attempt, worker)``: ``jobkeeper.current_job()`` gives all three.

What the checker verifies (each failure is a :class:`Violation`)
    - every enqueued job is in the tables exactly once (``lost``,
      ``duplicate_row``, ``unknown_row``), in a terminal state (``completed``,
      ``dead``, ``cancelled``) or deliberately left pending
      (``not_terminal``, ``pending_ran``), and in the state its kind allows
      (``wrong_outcome``);
    - no two executions of a job overlapped unless the first holder's
      attempt was rescued after it had been silent (no heartbeat) for
      ``rescue_after`` (``overlap``: two live holders);
    - no rescue took a job from a holder that had heartbeaten within
      ``rescue_after`` (``rescued_live_holder``);
    - every ``completed`` write came from the attempt's current holder: the
      stored result names the execution that produced it, that execution is
      the row's current attempt, it ended ``ok``, its claim was never rescued,
      and (with the ack audit) exactly one completion was written, by that
      holder (``bad_completion``, ``duplicate_completion``);
    - with flow control on (``History.caps``, serial keys on the rows): never
      more executions of a capped queue at once than its ``concurrency``
      (``cap_exceeded``), and never two jobs of one serial key at once
      (``serial_overlap``); an execution stops counting when its claim is
      rescued;
    - no execution started after its job had finished (``ran_after_finish``),
      nor while it was in the dead letters before a requeue; none is of a
      job nobody enqueued (``phantom_execution``), and the log is well
      formed (``bad_log``);
    - claim numbers: a job's executions' fences strictly grow in order of
      start, across requeues too, but for a stale start of a rescued claim
      (``fence_not_increasing``), and no two executions share one
      (``fence_reused``); the final row agrees with the last claim
      (``final_row_mismatch``);
    - the dead letters' way back: every confirmed requeue is followed by a
      run or a new end of the job (``requeue_lost``), and a job left the
      dead letters as often as it was requeued, counting maybe-requeues
      (``dead_letter_accounting``; never, for a job never requeued).

Where each part lives: the records a run leaves in :mod:`.records`, the
rescues and the live-holder check in :mod:`.rescues`, the checks of each
job's final row in :mod:`.job_checks`, those of what ran at once in
:mod:`.concurrency_checks`, fences and requeues in :mod:`.requeue_checks`;
here, the order they run in and the report.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from benchmarks.soak.check_context import CheckContext
from benchmarks.soak.concurrency_checks import check_limits, check_overlaps
from benchmarks.soak.job_checks import (
    check_completions,
    check_phantoms,
    check_states,
    check_tables,
)
from benchmarks.soak.records import (
    Ack,
    Expected,
    History,
    Requeue,
    Row,
    deaths_by_pid,
    faulted_at,
    parse_db_time,
)
from benchmarks.soak.requeue_checks import check_fences, check_requeues
from benchmarks.soak.rescues import check_rescues, rescues_of

# The log and the report are the package's (``jobkeeper verify`` writes and
# reads the same log); this checker is the stricter one: it also reads the
# database's own audit of heartbeats and acks.
from jobkeeper.verify.history import (
    Event,
    ExecLog,
    Execution,
    Report,
    Violation,
    executions_of,
    read_exec_logs,
)

# The soak's driver and tests import all of these from here, wherever they live.
__all__ = [
    "Ack",
    "Event",
    "ExecLog",
    "Expected",
    "History",
    "Report",
    "Requeue",
    "Row",
    "Violation",
    "check",
    "deaths_by_pid",
    "faulted_at",
    "parse_db_time",
    "percentile",
    "read_exec_logs",
    "rescues_of",
]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def _executions(ctx: CheckContext) -> dict[int, list[Execution]]:
    per_job, problems = executions_of(ctx.h.events, ctx.h.bad_log_lines)
    for job, detail in problems:
        ctx.flag("bad_log", job, detail)
    return per_job


def check(history: History) -> Report:
    """Verify ``history``; see the module docstring for what is checked."""
    ctx = CheckContext(history)
    # Each check adds its stats in turn: this order is the report's.
    rows = check_tables(ctx)
    executions = _executions(ctx)
    check_states(ctx, rows, executions)
    rescues = check_rescues(ctx, rows)
    check_overlaps(ctx, executions, rescues)
    check_limits(ctx, rows, executions, rescues)
    check_completions(ctx, rows, executions, rescues)
    check_phantoms(ctx, rows, executions)
    check_fences(ctx, rows, executions, rescues)
    check_requeues(ctx, rows, executions, rescues)
    status = Counter(row.status for row in rows.values())
    all_runs = [run for runs in executions.values() for run in runs]
    ctx.stats.update(
        jobs=len(history.enqueued),
        ambiguous_enqueues=len(history.ambiguous),
        requeues_confirmed=sum(r.confirmed for r in history.requeues),
        requeues_maybe=sum(not r.confirmed for r in history.requeues),
        rows=len(rows),
        by_status=dict(sorted(status.items())),
        executions=len(all_runs),
        executions_unfinished=sum(1 for r in all_runs if r.end is None),
        re_executed_jobs=sum(
            1 for runs in executions.values() if sum(r.outcome == "ok" for r in runs) > 1
        ),
        violations=len(ctx.violations),
    )
    return Report(ctx.violations, ctx.stats)
