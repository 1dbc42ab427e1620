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
      none is of a job nobody enqueued (``phantom_execution``), and the log
      is well formed (``bad_log``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

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
    pid_of,
    read_exec_logs,
)

__all__ = [
    "Ack",
    "Event",
    "ExecLog",
    "Expected",
    "History",
    "Report",
    "Row",
    "Violation",
    "check",
    "read_exec_logs",
]

#: Seconds of slack when comparing a log time (the worker's clock) with a
#: database time (the server's clock): both are this machine's clock, read at
#: slightly different moments.
TOLERANCE = 0.05

TERMINAL = frozenset({"completed", "dead", "cancelled"})
PENDING = frozenset({"scheduled", "available", "retryable"})
#: Job kinds that must end dead (their task never succeeds).
MUST_DIE = frozenset({"fail", "discard", "poison"})
#: Kinds whose tasks write the execution log and return ``{n, worker, attempt}``.
LOGGED = frozenset({"ok", "flaky", "retry", "fail", "discard", "long"})

_RESCUE = re.compile(r"worker lost: (\S+) sent no heartbeat")
#: In a rescue record whose crash was pinned on the job.
_PINNED = ", alone: crashed its worker "


# -- the history ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Expected:
    """One job the driver enqueued and got an id back for."""

    token: int  # args["n"], unique per enqueue call
    kind: str  # ok | flaky | retry | fail | discard | long | noop | pending | cancel


@dataclasses.dataclass(slots=True)
class Row:
    """One row of ``jobkeeper_jobs`` (or, with ``status="dead"``, of the dead letters)."""

    id: int
    status: str
    attempt: int
    max_attempts: int
    token: int | None
    result: Any = None
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    finished_at: float | None = None
    worker_id: str | None = None
    queue: str | None = None
    serial_key: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """An audited write that took a job out of ``claimed``/``running`` (completion,
    failure, rescue, hand-back or dead-letter move), with the holder it was
    fenced on (the row's values before the write).
    """

    job: int
    new_status: str  # completed | retryable | available | cancelled | removed
    worker: str
    attempt: int
    at: float
    fence: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Rescue:
    job: int
    attempt: int
    worker: str
    at: float
    fence: int | None = None  # None: not known (no ack audit)


@dataclasses.dataclass
class History:
    """Everything the checker reads.

    Attributes:
        rescue_after: the workers' setting, seconds.
        enqueued: job id -> what was enqueued (enqueue returned that id).
        ambiguous: token -> kind, for enqueue calls that raised: the job may
            or may not exist (a commit whose reply was lost), but not twice.
        rows: the final tables.
        events: the execution log.
        heartbeats: worker id -> the database times of its heartbeats
            (``None``: not recorded; overlaps are then justified by a rescue
            record alone).
        acks: the ack audit (``None``: not recorded).
        deaths: worker id -> when its process died (SIGKILL), log clock.
        bad_log_lines: malformed log lines found while reading.
        caps: queue -> its ``concurrency`` setting for the whole run (the
            flow-control soak): never more of its executions at once.
        rate_limits: queue -> ``(count, period seconds)``: reported (the
            most starts seen in any window), not checked: a start follows
            its claim, which is what the limit counts, by a varying delay.
        faulted: worker pid -> the spans (log clock) in which the soak's own
            faults (a SIGKILL, a SIGSTOP, a partition; never a poison job's
            self-kill) kept that process from heartbeating. A crash pinned on
            a job in such a span was the soak's doing, not the job's.
    """

    rescue_after: float
    enqueued: dict[int, Expected]
    rows: list[Row]
    events: list[Event]
    ambiguous: dict[int, str] = dataclasses.field(default_factory=dict)
    heartbeats: dict[str, list[float]] | None = None
    acks: list[Ack] | None = None
    deaths: dict[str, float] = dataclasses.field(default_factory=dict)
    bad_log_lines: int = 0
    caps: dict[str, int] = dataclasses.field(default_factory=dict)
    rate_limits: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    faulted: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)


def parse_db_time(value: Any) -> float | None:
    """An error entry's ``at`` (ISO 8601 text), a datetime or epoch seconds -> epoch seconds."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


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


def faulted_at(
    faulted: Mapping[int, Sequence[tuple[float, float]]], worker: str, at: float
) -> bool:
    """Whether the soak's faults kept ``worker`` (``host:pid:random``) silent
    at ``at``, by ``faulted`` (see :attr:`History.faulted`).
    """
    pid = pid_of(worker)
    return pid is not None and any(start <= at <= end for start, end in faulted.get(pid, ()))


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


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


# -- the checker ----------------------------------------------------------------------


class _Checker:
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

    # -- pieces -------------------------------------------------------------------

    def executions(self) -> dict[int, list[Execution]]:
        per_job, problems = executions_of(self.h.events, self.h.bad_log_lines)
        for job, detail in problems:
            self.flag("bad_log", job, detail)
        return per_job

    def effective_end(self, execution: Execution) -> float:
        """When an execution stopped: its end event, else its process's death."""
        if execution.end is not None:
            return execution.end
        death = self.h.deaths.get(execution.worker)
        if death is not None and death >= execution.start - TOLERANCE:
            return death
        return math.inf

    def check_tables(self) -> dict[int, Row]:
        rows: dict[int, Row] = {}
        by_token: dict[int, list[Row]] = defaultdict(list)
        for row in self.h.rows:
            if row.id in rows:
                self.flag(
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
                self.flag("duplicate_row", ids[0], f"token {token} stored as jobs {ids}")
        known_tokens = {e.token for e in self.h.enqueued.values()} | set(self.h.ambiguous)
        for row in rows.values():
            expected = self.h.enqueued.get(row.id)
            if expected is None:
                if row.token is None or row.token not in known_tokens:
                    self.flag("unknown_row", row.id, f"nobody enqueued it (token {row.token})")
                elif row.token not in self.h.ambiguous:
                    self.flag("duplicate_row", row.id, f"second row for token {row.token}")
            elif row.token != expected.token:
                self.flag(
                    "unknown_row", row.id, f"holds token {row.token}, enqueued {expected.token}"
                )
        lost = [job_id for job_id in self.h.enqueued if job_id not in rows]
        for job_id in lost:
            self.flag("lost", job_id, f"enqueued ({self.h.enqueued[job_id].kind}), in no table")
        self.stats["lost"] = len(lost)
        return rows

    def kind_of(self, row: Row) -> str | None:
        expected = self.h.enqueued.get(row.id)
        if expected is not None:
            return expected.kind
        return self.h.ambiguous.get(row.token) if row.token is not None else None

    def check_states(self, rows: dict[int, Row], executions: dict[int, list[Execution]]) -> None:
        for row in rows.values():
            kind = self.kind_of(row)
            if kind == "pending":
                if row.status not in PENDING:
                    self.flag("pending_ran", row.id, f"left pending on purpose, is {row.status}")
                elif executions.get(row.id):
                    self.flag("pending_ran", row.id, "left pending on purpose, but it ran")
                continue
            if row.status not in TERMINAL:
                holder = f" (held by {row.worker_id})" if row.worker_id else ""
                self.flag("not_terminal", row.id, f"ended the run {row.status}{holder}")
                continue
            if kind == "cancel" and row.status != "cancelled":
                self.flag("wrong_outcome", row.id, f"cancelled before it ran, is {row.status}")
            elif kind in MUST_DIE and row.status != "dead":
                self.flag("wrong_outcome", row.id, f"its task never succeeds, is {row.status}")
            elif row.status == "dead" and kind not in MUST_DIE and row.attempt < row.max_attempts:
                self.check_crash_budget(row, kind)
            if row.status == "dead" and not row.errors:
                self.flag("wrong_outcome", row.id, "dead letter without any error recorded")

    def check_crash_budget(self, row: Row, kind: str | None) -> None:
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
            self.flag(
                "wrong_outcome",
                row.id,
                f"dead after {row.attempt} of {row.max_attempts} attempts (kind {kind}), "
                "no crash pinned on it",
            )
            return
        for rescue in pinned:
            if not faulted_at(self.h.faulted, rescue.worker, rescue.at):
                self.flag(
                    "wrong_outcome",
                    row.id,
                    f"dead after {row.attempt} of {row.max_attempts} attempts (kind {kind}): "
                    f"a crash pinned on it at attempt {rescue.attempt} when its worker "
                    f"{rescue.worker} was neither killed, stopped nor cut off by the soak",
                )
                return
        self.stats.setdefault("dead_for_faults", []).append(row.id)

    def fence_of(self, rescue: Rescue) -> int | None:
        """The fence of the claim a rescue record took: from the audited
        write of that holder's attempt nearest in time (None: no audit).
        """
        writes = [
            ack
            for ack in self.acks_by_job.get(rescue.job, [])
            if (ack.attempt, ack.worker) == (rescue.attempt, rescue.worker)
            and ack.new_status != "completed"
        ]
        if not writes:
            return None
        return min(writes, key=lambda ack: abs(ack.at - rescue.at)).fence

    def check_rescues(self, rows: dict[int, Row]) -> Rescues:
        rescues = Rescues()
        since_heartbeat: list[float] = []
        since_death: list[float] = []
        for row in rows.values():
            for record in rescues_of(row):
                rescue = dataclasses.replace(record, fence=self.fence_of(record))
                rescues.add(rescue)
                if self.hb is not None:
                    silent = self.silent_for(rescue.worker, rescue.at)
                    if silent < self.h.rescue_after - TOLERANCE:
                        self.flag(
                            "rescued_live_holder",
                            rescue.job,
                            f"attempt {rescue.attempt} rescued from {rescue.worker}, which had "
                            f"heartbeaten {silent:.3f}s before (rescue_after="
                            f"{self.h.rescue_after:g}s)",
                        )
                    elif math.isfinite(silent):
                        since_heartbeat.append(silent)
                death = self.h.deaths.get(rescue.worker)
                if death is not None and death <= rescue.at + TOLERANCE:
                    since_death.append(rescue.at - death)
        # A holder silent past rescue_after whose job was still `claimed` in
        # the database (its start mark is batched, so a job that had started
        # may look unstarted) is given back free: available, the attempt not
        # spent, no errors entry. The ack audit is its only record; the next
        # holder runs the same attempt number. A hand-back by a live holder
        # (a graceful stop) looks the same there, but it had heartbeaten.
        free_returns = 0
        if self.hb is not None:
            for ack in self.h.acks or []:
                if ack.new_status != "available":
                    continue
                if rescues.of(ack.job, ack.attempt, ack.worker, ack.fence) is not None:
                    continue
                if self.silent_for(ack.worker, ack.at) >= self.h.rescue_after - TOLERANCE:
                    rescues.add(Rescue(ack.job, ack.attempt, ack.worker, ack.at, ack.fence))
                    free_returns += 1
        self.stats["free_returns"] = free_returns
        self.stats["rescues"] = len(rescues) - free_returns
        self.stats["rescue_after_last_heartbeat_s"] = since_heartbeat
        self.stats["rescue_after_kill_s"] = since_death
        return rescues

    def check_overlaps(
        self,
        executions: dict[int, list[Execution]],
        rescues: Rescues,
    ) -> None:
        justified = unjustified = stale_starts = 0
        for job, runs in executions.items():
            for i, a in enumerate(runs):
                end_a = self.effective_end(a)
                for b in runs[i + 1 :]:
                    if b.start >= end_a - TOLERANCE:
                        continue
                    # The first holder is the earlier claim: the lower attempt.
                    first, second = (
                        (a, b) if (a.attempt, a.start) <= (b.attempt, b.start) else (b, a)
                    )
                    reason = self.overlap_unjustified(first, second, rescues)
                    if reason is None:
                        justified += 1
                    else:
                        unjustified += 1
                        self.flag(
                            "overlap",
                            job,
                            f"attempt {first.attempt} on {first.worker} "
                            f"[{first.start:.3f}, {self.effective_end(first):.3f}] overlapped "
                            f"attempt {second.attempt} on {second.worker} from "
                            f"{second.start:.3f}: {reason}",
                        )
            for run in runs:
                rescue = rescues.of_run(run)
                if rescue is not None and run.start > rescue.at + TOLERANCE:
                    stale_starts += 1
        self.stats["overlaps_justified"] = justified
        self.stats["duplicates"] = unjustified
        self.stats["started_after_rescue"] = stale_starts

    def overlap_unjustified(
        self,
        first: Execution,
        second: Execution,
        rescues: Rescues,
    ) -> str | None:
        rescue = rescues.of_run(first)
        if rescue is None:
            return "the first holder's attempt was never rescued (two live holders)"
        if rescue.at > second.start + TOLERANCE:
            return f"the second started before the rescue at {rescue.at:.3f}"
        if self.hb is not None:
            silent = self.silent_for(first.worker, rescue.at)
            if silent < self.h.rescue_after - TOLERANCE:
                return f"the first holder had heartbeaten {silent:.3f}s before the rescue"
        return None

    def held_span(self, run: Execution, rescues: Rescues) -> tuple[float, float]:
        """When an execution counted against its queue's limits: from its
        start to its end (or its process's death), cut at the rescue of its
        claim. From the rescue on the database no longer counts it (the slot
        and the serial key are free again) while a stopped holder's code may
        still be frozen mid-run: that overlap is the justified kind.
        """
        end = self.effective_end(run)
        rescue = rescues.of_run(run)
        if rescue is not None:
            end = min(end, rescue.at - TOLERANCE)
        return run.start, end

    def check_limits(
        self,
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
                if row.queue in self.h.rate_limits:
                    starts[row.queue].append(run.start)
                start, end = self.held_span(run, rescues)
                if end <= start:
                    continue
                if row.queue in self.h.caps:
                    by_queue[row.queue].append((start, end, run))
                if row.serial_key is not None:
                    by_key[row.serial_key].append((start, end, run))
        most_running: dict[str, int] = {}
        for queue, cap in sorted(self.h.caps.items()):
            # Ends before starts at the same instant: a slot freed and taken.
            moments = sorted(
                [(start, 1, run) for start, _, run in by_queue[queue]]
                + [(end, -1, run) for _, end, run in by_queue[queue]],
                key=lambda m: (m[0], m[1]),
            )
            active: set[tuple[int, int, str]] = set()
            best = 0
            for at, step, run in moments:
                if step > 0:
                    active.add(run.key())
                    if len(active) == cap + 1:  # once per excess, not per start
                        shown = ", ".join(f"{j}#{a}@{w}" for j, a, w, _ in sorted(active))
                        self.flag(
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
                if (
                    holder is not None
                    and run.job != holder[2].job
                    and start < holder[1] - TOLERANCE
                ):
                    overlaps += 1
                    other = holder[2]
                    self.flag(
                        "serial_overlap",
                        run.job,
                        f"serial key {key!r}: attempt {run.attempt} on {run.worker} started at "
                        f"{start:.3f} while job {other.job} attempt {other.attempt} on "
                        f"{other.worker} ran [{holder[0]:.3f}, {holder[1]:.3f}]",
                    )
                if holder is None or end > holder[1]:
                    holder = span
        most_starts: dict[str, tuple[int, int]] = {}
        for queue, (count, period) in sorted(self.h.rate_limits.items()):
            times = sorted(starts[queue])
            best, lo = 0, 0
            for hi, at in enumerate(times):
                while times[lo] <= at - period:
                    lo += 1
                best = max(best, hi - lo + 1)
            most_starts[queue] = (best, count)
        self.stats["most_running"] = most_running
        self.stats["serial_keys"] = len(by_key)
        self.stats["serial_overlaps"] = overlaps
        self.stats["most_starts_in_a_window"] = most_starts

    def check_completions(
        self,
        rows: dict[int, Row],
        executions: dict[int, list[Execution]],
        rescues: Rescues,
    ) -> None:
        acks = self.acks_by_job
        for row in rows.values():
            runs = {run.key(): run for run in executions.get(row.id, [])}
            if row.finished_at is not None and row.status in TERMINAL:
                late = [r for r in runs.values() if r.start > row.finished_at + TOLERANCE]
                for run in late:
                    # A holder silenced (stopped, cut off) after its start
                    # check calls the task when it resumes; its claim was
                    # rescued and its ack is refused: a stale start, counted
                    # in started_after_rescue.
                    if rescues.of_run(run) is not None:
                        continue
                    self.flag(
                        "ran_after_finish",
                        row.id,
                        f"attempt {run.attempt} on {run.worker} started at {run.start:.3f}, "
                        f"after the job was {row.status} at {row.finished_at:.3f}",
                    )
            completions = [a for a in acks.get(row.id, []) if a.new_status == "completed"]
            if len(completions) > 1:
                writers = ", ".join(f"{a.worker}#{a.attempt}" for a in completions)
                self.flag(
                    "duplicate_completion", row.id, f"completed {len(completions)}x: {writers}"
                )
            if row.status != "completed":
                if completions:
                    self.flag(
                        "duplicate_completion",
                        row.id,
                        f"a completion was written but the job is {row.status}",
                    )
                continue
            if self.h.acks is not None and not completions:
                self.flag("bad_completion", row.id, "completed without an audited completion")
            for ack in completions[:1]:
                if ack.attempt != row.attempt:
                    self.flag(
                        "bad_completion",
                        row.id,
                        f"completion written for attempt {ack.attempt} by {ack.worker}, "
                        f"but the row is at attempt {row.attempt}",
                    )
            if self.kind_of(row) not in LOGGED:
                continue
            result = row.result if isinstance(row.result, dict) else {}
            worker, attempt = result.get("worker"), result.get("attempt")
            fence = result.get("fence")
            if attempt != row.attempt or not isinstance(worker, str) or not isinstance(fence, int):
                self.flag(
                    "bad_completion",
                    row.id,
                    f"result from {worker}#{attempt} (fence {fence}), but the row is at "
                    f"attempt {row.attempt}",
                )
                continue
            if row.token is not None and result.get("n") != row.token:
                self.flag("bad_completion", row.id, f"result of token {result.get('n')}")
            run = runs.get((row.id, attempt, worker, fence))
            if run is None or run.outcome != "ok":
                state = "never ran" if run is None else f"ended {run.outcome or 'never'}"
                self.flag(
                    "bad_completion",
                    row.id,
                    f"completed by {worker}#{attempt}, whose execution {state}",
                )
            if rescues.of(row.id, attempt, worker, fence) is not None:
                self.flag(
                    "bad_completion",
                    row.id,
                    f"completed by {worker}#{attempt} (fence {fence}), whose claim had been "
                    "rescued",
                )
            for ack in completions[:1]:
                if ack.worker != worker or ack.fence not in (None, fence):
                    self.flag(
                        "bad_completion",
                        row.id,
                        f"result is {worker}'s (fence {fence}) but the completion was fenced "
                        f"on {ack.worker} (fence {ack.fence})",
                    )
                if run is not None and run.end is not None and ack.at < run.end - TOLERANCE:
                    self.flag("bad_completion", row.id, "completion written before the task ended")

    def check_phantoms(self, rows: dict[int, Row], executions: dict[int, list[Execution]]) -> None:
        for job in executions:
            if job not in rows and job not in self.h.enqueued:
                self.flag("phantom_execution", job, "executed, but no such job exists")

    def run(self) -> Report:
        rows = self.check_tables()
        executions = self.executions()
        self.check_states(rows, executions)
        rescues = self.check_rescues(rows)
        self.check_overlaps(executions, rescues)
        self.check_limits(rows, executions, rescues)
        self.check_completions(rows, executions, rescues)
        self.check_phantoms(rows, executions)
        status = Counter(row.status for row in rows.values())
        all_runs = [run for runs in executions.values() for run in runs]
        self.stats.update(
            jobs=len(self.h.enqueued),
            ambiguous_enqueues=len(self.h.ambiguous),
            rows=len(rows),
            by_status=dict(sorted(status.items())),
            executions=len(all_runs),
            executions_unfinished=sum(1 for r in all_runs if r.end is None),
            re_executed_jobs=sum(
                1 for runs in executions.values() if sum(r.outcome == "ok" for r in runs) > 1
            ),
            violations=len(self.violations),
        )
        return Report(self.violations, self.stats)


def check(history: History) -> Report:
    """Verify ``history``; see the module docstring for what is checked."""
    return _Checker(history).run()


def deaths_by_pid(
    first_seen: Mapping[str, float], lives: Sequence[tuple[int, float, float | None]]
) -> dict[str, float]:
    """Map worker ids (``host:pid:random``) to the death times of their processes.

    Args:
        first_seen: worker id -> the earliest time it appears (log, heartbeats).
        lives: ``(pid, started, died)`` of each worker process the driver ran
            (``died`` None: still alive, or stopped gracefully). A pid reused
            by a later process is told apart by the start times.
    """
    by_pid: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
    for pid, started, died in lives:
        by_pid[pid].append((started, died))
    deaths: dict[str, float] = {}
    for worker, seen in first_seen.items():
        own = pid_of(worker)
        for started, died in by_pid.get(own, []) if own is not None else []:
            if started - 1.0 <= seen and (died is None or seen <= died + 1.0):
                if died is not None:
                    deaths[worker] = died
                break
    return deaths
