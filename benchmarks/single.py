"""The single-enqueue figures of one run, every library's calls interleaved.

Each participant (every library's single enqueue, jobkeeper's async one, and
a raw one-row INSERT) gets a fresh database and a client opened before any
clock starts. Then they take turns: ``BLOCK`` calls of one, then ``BLOCK`` of
the next, round after round, until each has made ``n`` (after a first,
untimed round of ``WARMUP`` calls each). Each round starts one participant
further along, so none always follows the same other.

Why turns rather than each library's ``n`` calls one after another: a single
enqueue is one commit, and how long a commit's fsync takes on a shared
machine drifts over seconds. Measured back to back, 2,000 calls of each
library saw different disks: in two full runs of the same code the ratio of
jobkeeper's p99 to pgqueuer's was 0.87 and then 1.74, and every library's
rate moved with the raw INSERT measured minutes apart (``make bench`` of
2026-12-03). Interleaved in blocks of 100, every participant meets the same
drift, so the ratios compare the clients, which is what they are for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks import raw
from benchmarks.harness import NotAvailableError
from benchmarks.libs import Block, CallTimes, Library
from benchmarks.measures import Context, call_figures
from benchmarks.report import RAW

#: Calls of one participant before the next takes its turn.
BLOCK = 100
#: Untimed calls of each participant before the first timed round (prepared
#: statements, pools and caches settle).
WARMUP = 20


@dataclass
class Participant:
    """One client taking turns: ``lib`` (a library's name or ``raw``) and the
    metric its calls give (``enqueue_single``, ``enqueue_single_async`` or
    ``raw_insert_single``)."""

    lib: str
    metric: str
    block: Block
    seconds: float = 0.0
    durations: list[float] = field(default_factory=list)

    def figures(self, n: int) -> dict[str, float]:
        if self.metric == "raw_insert_single":
            return {self.metric: n / self.seconds}
        return call_figures(self.metric, CallTimes(self.seconds, self.durations), n)


def _raw_block(timed: Callable[[int], float]) -> Block:
    """A raw inserter's block as a :data:`Block` (its calls are not timed
    one by one: only its rate is reported)."""
    return lambda k: CallTimes(timed(k), [])


def measure(
    ctx: Context, libs: list[Library], fail: Callable[[str, list[str], str], None]
) -> dict[str, dict[str, float]]:
    """One run's single-enqueue figures, by library (``raw``: the raw INSERT's
    rate). A participant that cannot open, or fails a block, is reported
    through ``fail(lib, metrics, reason)`` and the others go on.
    """
    n = ctx.sizes.single
    pg = ctx.backend == "postgres"
    with contextlib.ExitStack() as stack:
        participants: list[Participant] = []

        def join(lib: str, metric: str, label: str, open_block: Callable[[str], Block]) -> None:
            try:
                url = stack.enter_context(ctx.fresh(label))
                participants.append(Participant(lib, metric, open_block(url)))
            except Exception as exc:
                fail(lib, [metric, f"{metric}_p50", f"{metric}_p99"], _reason(exc))

        for lib in libs:
            if lib.unavailable:
                continue

            def library_block(url: str, lib: Library = lib, asynchronous: bool = False) -> Block:
                lib.prepare(url)
                opener = lib.single_enqueuer_async if asynchronous else lib.single_enqueuer
                return stack.enter_context(opener(url))

            join(lib.name, "enqueue_single", f"{lib.name}_enq1", library_block)
            if lib.no_async_single is not None:
                fail(lib.name, ["enqueue_single_async*"], lib.no_async_single)
            else:

                def async_block(url: str, lib: Library = lib) -> Block:
                    return library_block(url, lib, asynchronous=True)

                join(lib.name, "enqueue_single_async", f"{lib.name}_enq1async", async_block)

        def raw_block(url: str) -> Block:
            (raw.pg_prepare if pg else raw.sqlite_prepare)(url)
            inserter = raw.pg_single_inserter if pg else raw.sqlite_single_inserter
            return _raw_block(stack.enter_context(inserter(url)))

        join(RAW, "raw_insert_single", "raw_insert1", raw_block)
        _take_turns(participants, n, fail)
        return _collect(participants, n)


def _take_turns(
    participants: list[Participant], n: int, fail: Callable[[str, list[str], str], None]
) -> None:
    for participant in list(participants):
        try:
            participant.block(WARMUP)
        except Exception as exc:
            _drop(participants, participant, fail, exc)
    done = 0
    shift = 0
    while done < n:
        k = min(BLOCK, n - done)
        start = shift % len(participants) if participants else 0
        order = participants[start:] + participants[:start]
        for participant in order:
            try:
                times = participant.block(k)
            except Exception as exc:
                _drop(participants, participant, fail, exc)
                continue
            participant.seconds += times.seconds
            participant.durations += times.durations
        done += k
        shift += 1


def _collect(participants: list[Participant], n: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    for participant in participants:
        figures.setdefault(participant.lib, {}).update(participant.figures(n))
    return figures


def _drop(
    participants: list[Participant],
    participant: Participant,
    fail: Callable[[str, list[str], str], None],
    exc: BaseException,
) -> None:
    participants.remove(participant)
    metric = participant.metric
    fail(participant.lib, [metric, f"{metric}_p50", f"{metric}_p99"], _reason(exc))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, NotAvailableError):
        return str(exc)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
