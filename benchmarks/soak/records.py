"""What a soak run leaves behind for the history checker: the jobs the driver
enqueued, the final tables, the database's ack audit, and when the soak's
faults silenced or killed worker processes (the execution log's types are
the package's: :mod:`jobkeeper.verify.history`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from jobkeeper.verify.history import Event, pid_of

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
    fence: int | None = None  # the last claim's number (None: not read)


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
class Requeue:
    """One job the requeuer took out of the dead letters (or may have).

    ``began``/``ended`` bound the call on this machine's clock (the move
    committed in between); ``confirmed``: the call said the job moved,
    else the outcome is unknown (the connection died at the commit, a CLI
    run timed out): maybe requeued, maybe not.
    """

    job: int
    way: str  # api_requeue_dead | api_retry | cli_dead_requeue | cli_retry
    began: float
    ended: float
    confirmed: bool = True


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
        requeues: the requeuer's moves out of the dead letters, confirmed
            and maybe (see :class:`Requeue`); a job in none of them must
            never leave the dead letters.
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
    requeues: list[Requeue] = dataclasses.field(default_factory=list)


def parse_db_time(value: Any) -> float | None:
    """An error entry's ``at`` (ISO 8601 text), a datetime or epoch seconds -> epoch seconds."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def faulted_at(
    faulted: Mapping[int, Sequence[tuple[float, float]]], worker: str, at: float
) -> bool:
    """Whether the soak's faults kept ``worker`` (``host:pid:random``) silent
    at ``at``, by ``faulted`` (see :attr:`History.faulted`).
    """
    pid = pid_of(worker)
    return pid is not None and any(start <= at <= end for start, end in faulted.get(pid, ()))


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
