"""``jobkeeper verify``'s history: the execution log its tasks write, and the
checker that holds the log, the final rows and the faults against each other
(the chaos soak's checker, cut down to what a user's deployment can show:
every time compared is this machine's clock, never the database server's).

The log
    Each task appends ``start`` and ``end`` events to a per-process file
    opened with ``O_APPEND``, one ``write(2)`` per event: a SIGKILL leaves
    whole lines. An execution is ``(job, attempt, worker, fence)``: a claim
    given back free (its attempt not spent) and claimed again by the same
    worker runs the same attempt number, under a new fence.

What is checked (each failure is a :class:`Violation`)
    - ``lost``: an enqueued job is in neither the jobs nor the dead letters;
      ``duplicate_row``: in both, or twice; ``phantom``: a row or an
      execution of a job nobody enqueued;
    - ``not_terminal`` / ``wrong_outcome``: every job ends completed, dead or
      cancelled, as its kind says;
    - ``overlap``: two executions of one job ran at once, and the earlier
      holder had not been silent (SIGKILLed, or SIGSTOPped) for
      ``rescue_after`` when the later one started (less the one heartbeat
      interval its last heartbeat may have come before its SIGSTOP);
    - ``rescued_live_holder``: a job was rescued from a worker that was never
      killed, stopped or paused;
    - ``bad_completion``: the completed result is not from the attempt's last
      holder, or from an execution that never ended ``ok``, or from a claim
      that was rescued (an ack by a non-holder);
    - ``bad_log``: malformed lines, an end without a start.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import secrets
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

#: Seconds of slack between two readings of this machine's clock by
#: different processes.
TOLERANCE = 0.05
#: What each kind of job must end as.
OUTCOMES = {
    "ok": "completed",
    "flaky": "completed",
    "retry": "completed",
    "fail": "dead",
    "discard": "dead",
    "cancel": "cancelled",
}
_RESCUE = re.compile(r"worker lost: (\S+) sent no heartbeat")


class ExecLog:
    """Appends events to ``<directory>/exec-<pid>-<random>.log``; opened on
    first use, in the process that writes. Each event is one ``os.write``.

    Args:
        directory: an existing directory (str or path).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                name = f"exec-{os.getpid()}-{secrets.token_hex(4)}.log"
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
                self._fd = os.open(self.directory / name, flags, 0o600)
            return self._fd

    def start(self, job: int, attempt: int, worker: str, fence: int) -> None:
        self._write(f"S\t{job}\t{attempt}\t{worker}\t{fence}\t{time.time():.6f}\n")

    def end(self, job: int, attempt: int, worker: str, fence: int, outcome: str) -> None:
        self._write(f"E\t{job}\t{attempt}\t{worker}\t{fence}\t{time.time():.6f}\t{outcome}\n")

    def _write(self, line: str) -> None:
        fd = self._fd if self._fd is not None else self._open()
        os.write(fd, line.encode())


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    kind: str  # "S" (start) or "E" (end)
    job: int
    attempt: int
    worker: str
    t: float
    outcome: str = ""
    fence: int = 0

    def key(self) -> tuple[int, int, str, int]:
        """The execution this event belongs to."""
        return (self.job, self.attempt, self.worker, self.fence)


def read_exec_logs(directory: str | os.PathLike[str]) -> tuple[list[Event], int]:
    """Every event of ``directory``'s ``exec-*.log`` files, and how many lines
    were malformed.
    """
    events: list[Event] = []
    bad = 0
    for path in sorted(Path(directory).glob("exec-*.log")):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            try:
                if fields[0] == "S" and len(fields) == 6:
                    job, attempt, worker, fence, t = fields[1:]
                    events.append(
                        Event("S", int(job), int(attempt), worker, float(t), fence=int(fence))
                    )
                elif fields[0] == "E" and len(fields) == 7:
                    job, attempt, worker, fence, t, outcome = fields[1:]
                    events.append(
                        Event("E", int(job), int(attempt), worker, float(t), outcome, int(fence))
                    )
                else:
                    bad += 1
            except ValueError:
                bad += 1
    return events, bad


@dataclasses.dataclass(slots=True)
class Row:
    """A job's final row (``status="dead"``: its dead letter)."""

    id: int
    status: str
    attempt: int
    result: Any = None
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class Life:
    """One worker process the driver ran, on this machine's clock.

    Attributes:
        pid: its process id.
        started: when it was started.
        ended: when it was seen gone (SIGKILL or a graceful stop), else None.
        killed: whether it was SIGKILLed.
        pauses: ``(SIGSTOP, SIGCONT)`` times.
    """

    pid: int
    started: float
    ended: float | None = None
    killed: bool = False
    pauses: list[tuple[float, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class Execution:
    job: int
    attempt: int
    worker: str
    start: float
    end: float | None = None
    outcome: str | None = None
    fence: int = 0

    def key(self) -> tuple[int, int, str, int]:
        return (self.job, self.attempt, self.worker, self.fence)


def executions_of(
    events: list[Event], bad_lines: int = 0
) -> tuple[dict[int, list[Execution]], list[tuple[int | None, str]]]:
    """The executions in ``events``, by job, each job's in start order; and
    what is wrong with the log: ``(job, detail)`` per problem (a second
    start or end of one execution, an end without its start, the
    ``bad_lines`` malformed lines read).
    """
    by_key: dict[tuple[int, int, str, int], Execution] = {}
    ends: list[Event] = []
    problems: list[tuple[int | None, str]] = []
    for event in sorted(events, key=lambda e: (e.t, e.kind != "S")):
        if event.kind != "S":
            ends.append(event)
        elif event.key() in by_key:
            problems.append((event.job, f"attempt {event.attempt} started twice by {event.worker}"))
        else:
            by_key[event.key()] = Execution(
                event.job, event.attempt, event.worker, event.t, fence=event.fence
            )
    for event in ends:
        run = by_key.get(event.key())
        if run is None:
            problems.append((event.job, f"an end without its start: {event}"))
        elif run.end is not None:
            problems.append((event.job, f"attempt {event.attempt} ended twice"))
        else:
            run.end, run.outcome = event.t, event.outcome
    if bad_lines:
        problems.append((None, f"{bad_lines} malformed log lines"))
    per_job: dict[int, list[Execution]] = defaultdict(list)
    for run in by_key.values():
        per_job[run.job].append(run)
    for runs in per_job.values():
        runs.sort(key=lambda r: r.start)
    return per_job, problems


@dataclasses.dataclass
class History:
    """Everything the checker reads.

    Attributes:
        rescue_after: the workers' setting, seconds.
        heartbeat_interval: the workers' setting, seconds. A holder's last
            heartbeat may come up to one interval before it is stopped, so
            its silence (what a rescue waits out) may start that much
            before the SIGSTOP the driver saw.
        enqueued: job id -> its kind (a key of ``OUTCOMES``).
        rows: the final rows of the run's queue (jobs and dead letters).
        events: the execution log.
        lives: the worker processes.
        bad_log_lines: malformed log lines.
    """

    rescue_after: float
    enqueued: dict[int, str]
    rows: list[Row]
    events: list[Event]
    heartbeat_interval: float = 0.0
    lives: list[Life] = dataclasses.field(default_factory=list)
    bad_log_lines: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    job: int | None
    detail: str

    def __str__(self) -> str:
        where = f"job {self.job}: " if self.job is not None else ""
        return f"[{self.kind}] {where}{self.detail}"


@dataclasses.dataclass
class Report:
    violations: list[Violation]
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.violations

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind)


def pid_of(worker: str) -> int | None:
    """The pid in a worker id (``host:pid:random``); None if it has none."""
    try:
        return int(worker.rsplit(":", 2)[1])
    except (IndexError, ValueError):
        return None


class _Checker:
    def __init__(self, history: History) -> None:
        self.h = history
        self.violations: list[Violation] = []
        self.stats: dict[str, Any] = {}

    def flag(self, kind: str, job: int | None, detail: str) -> None:
        self.violations.append(Violation(kind, job, detail))

    def life_of(self, worker: str, at: float) -> Life | None:
        """The process that ran as ``worker`` around ``at`` (pids may be reused)."""
        pid = pid_of(worker)
        for life in self.h.lives:
            ended = math.inf if life.ended is None else life.ended
            if life.pid == pid and life.started - 1.0 <= at <= ended + 1.0:
                return life
        return None

    def silent_since(self, worker: str, seen: float, at: float) -> float | None:
        """When ``worker`` (seen running at ``seen``) went silent for good
        enough to be rescued by ``at``: its death, or the SIGSTOP of a pause
        that lasted past ``at - slack``. ``None``: it was not silent then.
        """
        life = self.life_of(worker, seen)
        if life is None:
            return None
        if life.ended is not None and life.ended <= at + TOLERANCE:
            return life.ended
        # A rescue made during the pause lets a new holder start a little
        # after the SIGCONT: its claim, then its start, follow the rescue.
        slack = self.h.rescue_after + 5.0
        for stopped, resumed in life.pauses:
            if stopped <= at <= resumed + slack:
                return stopped
        return None

    def executions(self) -> dict[int, list[Execution]]:
        per_job, problems = executions_of(self.h.events, self.h.bad_log_lines)
        for job, detail in problems:
            self.flag("bad_log", job, detail)
        return per_job

    def effective_end(self, run: Execution) -> float:
        """When an execution stopped: its end event, else its process's end."""
        if run.end is not None:
            return run.end
        life = self.life_of(run.worker, run.start)
        if life is not None and life.ended is not None:
            return life.ended
        return math.inf

    def check_rows(self) -> dict[int, Row]:
        rows: dict[int, Row] = {}
        for row in self.h.rows:
            if row.id in rows:
                self.flag(
                    "duplicate_row", row.id, f"stored twice ({rows[row.id].status}, {row.status})"
                )
                continue
            rows[row.id] = row
            kind = self.h.enqueued.get(row.id)
            if kind is None:
                self.flag("phantom", row.id, f"a {row.status} row nobody enqueued")
            elif row.status not in ("completed", "dead", "cancelled"):
                self.flag("not_terminal", row.id, f"still {row.status}")
            elif row.status != OUTCOMES[kind]:
                self.flag("wrong_outcome", row.id, f"a {kind} job ended {row.status}")
        lost = [job for job in self.h.enqueued if job not in rows]
        for job in lost:
            self.flag("lost", job, f"a {self.h.enqueued[job]} job is in no table")
        self.stats["lost"] = len(lost)
        return rows

    def rescues(self, rows: dict[int, Row]) -> set[tuple[int, int, str]]:
        """``(job, attempt, worker)`` of each rescued claim; flags rescues of
        holders that were never silent.
        """
        found: set[tuple[int, int, str]] = set()
        for row in rows.values():
            for entry in row.errors:
                match = _RESCUE.match(str(entry.get("error") or ""))
                if not match:
                    continue
                worker = match.group(1)
                found.add((row.id, int(entry.get("attempt") or 0), worker))
                life = self.life_of(worker, self.first_seen.get(worker, 0.0))
                if life is None:
                    continue  # a worker of a run whose log it never wrote
                if life.ended is None and not life.pauses:
                    self.flag(
                        "rescued_live_holder", row.id, f"rescued from {worker}, never silenced"
                    )
        self.stats["rescues"] = len(found)
        return found

    def check_overlaps(self, executions: dict[int, list[Execution]]) -> None:
        justified = unjustified = 0
        for job, runs in executions.items():
            for i, first in enumerate(runs):
                end = self.effective_end(first)
                for second in runs[i + 1 :]:
                    if second.start >= end - TOLERANCE:
                        continue
                    since = self.silent_since(first.worker, first.start, second.start)
                    if since is not None and second.start - since >= (
                        self.h.rescue_after - self.h.heartbeat_interval - TOLERANCE
                    ):
                        justified += 1
                        continue
                    unjustified += 1
                    why = (
                        "its holder was running"
                        if since is None
                        else f"its holder had been silent only {second.start - since:.2f}s"
                    )
                    self.flag(
                        "overlap",
                        job,
                        f"attempt {first.attempt} on {first.worker} was still running when "
                        f"attempt {second.attempt} started on {second.worker}: {why}",
                    )
        self.stats["overlaps_justified"] = justified
        self.stats["overlaps"] = unjustified

    def check_completions(
        self,
        rows: dict[int, Row],
        executions: dict[int, list[Execution]],
        rescued: set[tuple[int, int, str]],
    ) -> None:
        for row in rows.values():
            runs = executions.get(row.id, [])
            if row.status != "completed":
                continue
            result = row.result if isinstance(row.result, dict) else {}
            worker, attempt = result.get("worker"), result.get("attempt")
            fence = result.get("fence")
            if attempt != row.attempt or not isinstance(worker, str):
                self.flag(
                    "bad_completion",
                    row.id,
                    f"result from {worker}#{attempt}, but the row is at attempt {row.attempt}",
                )
                continue
            run = next(
                (
                    r
                    for r in runs
                    if (r.attempt, r.worker) == (attempt, worker) and fence in (None, r.fence)
                ),
                None,
            )
            if run is None or run.outcome != "ok":
                state = "never ran" if run is None else f"ended {run.outcome or 'never'}"
                self.flag(
                    "bad_completion", row.id, f"completed by {worker}#{attempt}, which {state}"
                )
                continue
            if (row.id, attempt, worker) in rescued:
                self.flag(
                    "bad_completion", row.id, f"completed by {worker}, whose claim was rescued"
                )
            # A later claim of the same attempt (a free return: the attempt
            # not spent) has a higher fence and took the claim from this one.
            later = [r for r in runs if r.attempt == attempt and r.fence > run.fence]
            if later:
                self.flag(
                    "bad_completion",
                    row.id,
                    f"completed by {worker}, after {later[0].worker} had claimed attempt "
                    f"{attempt} from it",
                )

    def check_phantoms(self, executions: dict[int, list[Execution]]) -> None:
        for job in executions:
            if job not in self.h.enqueued:
                self.flag("phantom", job, "executed, but nobody enqueued it")

    def run(self) -> Report:
        executions = self.executions()
        self.first_seen: dict[str, float] = {}
        for runs in executions.values():
            for r in runs:
                self.first_seen[r.worker] = min(self.first_seen.get(r.worker, r.start), r.start)
        rows = self.check_rows()
        rescued = self.rescues(rows)
        self.check_overlaps(executions)
        self.check_completions(rows, executions, rescued)
        self.check_phantoms(executions)
        all_runs = [r for runs in executions.values() for r in runs]
        self.stats.update(
            jobs=len(self.h.enqueued),
            by_status=dict(sorted(Counter(r.status for r in rows.values()).items())),
            executions=len(all_runs),
            cut_short=sum(1 for r in all_runs if r.end is None),
            violations=len(self.violations),
        )
        return Report(self.violations, self.stats)


def check(history: History) -> Report:
    """Check ``history``; see the module docstring for what."""
    return _Checker(history).run()
