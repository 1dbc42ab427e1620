"""Who held a rescued job and why it was silent: the spans the soak's own
faults (and poison jobs) silenced each worker, and the rescues judged by them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.soak.faults import Life
from benchmarks.soak.history import Row, faulted_at, rescues_of
from jobkeeper.verify.history import pid_of


def silences(
    lives: list[Life],
    pauses: Sequence[tuple[int, float, float]],
    cuts: Sequence[tuple[int, float, float, str]] = (),
) -> dict[int, list[tuple[float, float, str]]]:
    """Worker pid -> ``(from, until, why)``: the spans in which a worker was
    silent for a reason other than a fault of its own making, each with a
    second of slack for the rescuer's pass to land. ``why``: ``"dead"``
    (SIGKILLed by the injector), ``"poisoned"`` (a poison job's self-kill),
    ``"stopped"`` (SIGSTOP until SIGCONT), ``"cut"`` (a partition, until as
    long after its heal as it lasted: its connections' packets were dropped,
    and TCP's retransmission backoff, doubling, may wait about that long
    before it sends again).
    """
    spans: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for life in lives:
        if life.died is not None:
            why = "poisoned" if life.self_killed else "dead"
            spans[life.pid].append((max(life.started, life.died - 1.0), math.inf, why))
    for pid, t0, t1 in pauses:
        spans[pid].append((t0, t1 + 1.0, "stopped"))
    for pid, t0, t1, _ in cuts:
        spans[pid].append((t0, t1 + (t1 - t0) + 1.0, "cut"))
    return dict(spans)


def fault_windows(
    lives: list[Life],
    pauses: Sequence[tuple[int, float, float]],
    cuts: Sequence[tuple[int, float, float, str]] = (),
) -> dict[int, list[tuple[float, float]]]:
    """:attr:`History.faulted`: the :func:`silences` the soak's own faults
    caused (a poison job's self-kill is not the soak's).
    """
    return {
        pid: [(start, until) for start, until, why in spans if why != "poisoned"]
        for pid, spans in silences(lives, pauses, cuts).items()
    }


def lost_to_faults(row: Row, faulted: Mapping[int, Sequence[tuple[float, float]]]) -> int:
    """Rescues of ``row``'s job from a worker the soak itself had killed,
    stopped or cut off at the time: attempts a fault took, no crash of the
    job's own.
    """
    return sum(faulted_at(faulted, r.worker, r.at) for r in rescues_of(row))


def classify_rescues(
    rows: list[Row],
    lives: list[Life],
    pauses: list[tuple[int, float, float]],
    cuts: Sequence[tuple[int, float, float, str]] = (),
) -> dict[str, Any]:
    """Who each rescue took a job from: a SIGKILLed worker, a SIGSTOPped one,
    one cut off by a partition (see :func:`silences`), or a live one. A live
    holder (running, not stopped, reachable) must never lose its jobs, not
    even after a database outage longer than rescue_after.
    """
    counts: dict[str, Any] = {"dead": 0, "stopped": 0, "cut": 0, "live": 0, "examples": []}
    spans = silences(lives, pauses, cuts)
    for row in rows:
        for rescue in rescues_of(row):
            pid = pid_of(rescue.worker)
            held = spans.get(pid, []) if pid is not None else []
            whys = {why for start, until, why in held if start <= rescue.at <= until}
            if whys & {"dead", "poisoned"}:
                counts["dead"] += 1
            elif "stopped" in whys:
                counts["stopped"] += 1
            elif "cut" in whys:
                counts["cut"] += 1
            else:
                counts["live"] += 1
                counts["examples"].append(
                    f"job {rescue.job} attempt {rescue.attempt} from {rescue.worker}"
                )
    counts["examples"] = counts["examples"][:5]
    return counts
