"""The enqueue figures of one run, every client's calls taking turns.

Each participant (every library's single enqueue, jobkeeper's async one and
a raw one-row INSERT; or every library's bulk enqueue and the raw multi-row
INSERT and COPYs) gets a fresh database and a client opened before any clock
starts. After a first, untimed turn each, they take turns: a block of calls
of one, then a block of the next, round after round, until each has made its
``n`` calls; each round's order is shuffled (a fixed seed: the same order
every run), so that no participant always follows the same other, whose
writes the server may still be busy with.

Why turns rather than each library's calls one after another: an enqueue
ends in a commit, and how long a commit's fsync takes on a shared machine
drifts over seconds. Measured back to back, 2,000 single enqueues of each
library saw different disks: in two full runs of the same code the ratio of
jobkeeper's p99 to pgqueuer's was 0.87 and then 1.74, and every library's
rate moved with the raw INSERT measured minutes apart (``make bench`` of
2026-12-03); the bulk rows against the raw COPY measured in the raw stage
moved the same way. In turns, every participant meets the same drift, so the
ratios compare the clients, which is what they are for.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from benchmarks import raw
from benchmarks.harness import failure_reason
from benchmarks.libs import Block, CallTimes, Library
from benchmarks.measures import Context, call_figures, migrate_jobkeeper
from benchmarks.report import RAW

#: Single enqueues: calls of one participant before the next takes its turn,
#: and the untimed calls of each first (prepared statements, pools, caches).
SINGLE_BLOCK = 100
SINGLE_WARMUP = 20
#: Bulk enqueues: calls (of ``bulk_batch`` jobs) a turn, and untimed calls.
BULK_BLOCK = 1
BULK_WARMUP = 2
#: The seed of the turns' order (shuffled each round).
ORDER_SEED = 18

Fail = Callable[[str, list[str], str], None]


@dataclass
class Participant:
    """One client taking turns: ``lib`` (a library's name or ``raw``), the
    metric its calls give, and whether its calls' durations are reported
    (``calls``: the rate and the p50/p99 of its calls; else the rate alone).
    ``per_call``: jobs each call enqueues.
    """

    lib: str
    metric: str
    block: Block
    calls: bool
    per_call: int = 1
    seconds: float = 0.0
    durations: list[float] = field(default_factory=list)

    def figures(self, n: int) -> dict[str, float]:
        if not self.calls:
            return {self.metric: n * self.per_call / self.seconds}
        return call_figures(self.metric, CallTimes(self.seconds, self.durations), n)

    def metrics(self) -> list[str]:
        return _metrics(self.metric)


def _metrics(metric: str) -> list[str]:
    """The names a participant of ``metric`` reports (or fails)."""
    return [metric, f"{metric}_p50", f"{metric}_p99"]


def _seconds_only(timed: Callable[[int], float]) -> Block:
    """A raw client's ``block`` (seconds) as a :data:`Block`."""
    return lambda k: CallTimes(timed(k), [])


def singles(ctx: Context, libs: list[Library], fail: Fail) -> dict[str, dict[str, float]]:
    """One run's single-enqueue figures by library, and ``raw``'s one-row
    INSERT rate (``raw_insert_single``). A participant that cannot open, or
    fails a turn, is reported through ``fail(lib, metrics, reason)`` and the
    others go on.
    """
    pg = ctx.backend == "postgres"
    with _Table(ctx, fail) as table:
        for lib in libs:
            if lib.unavailable:
                continue
            table.join(lib, "enqueue_single", lib.single_enqueuer)
            if lib.no_async_single is not None:
                fail(lib.name, ["enqueue_single_async*"], lib.no_async_single)
            else:
                table.join(lib, "enqueue_single_async", lib.single_enqueuer_async)
        inserter = raw.pg_single_inserter if pg else raw.sqlite_single_inserter
        table.join_raw("raw_insert_single", inserter, 1)
        return table.run(ctx.sizes.single, SINGLE_BLOCK, SINGLE_WARMUP)


def bulks(ctx: Context, libs: list[Library], fail: Fail) -> dict[str, dict[str, float]]:
    """One run's bulk-enqueue rates by library (``enqueue_bulk``, jobs/s) and
    ``raw``'s: the multi-row INSERT, and on PostgreSQL the COPY into a plain
    table and into jobkeeper's own (``raw_insert_multirow``, ``raw_copy``,
    ``raw_copy_jobkeeper_table``), each call ``bulk_batch`` jobs.
    """
    batch = ctx.sizes.bulk_batch
    with _Table(ctx, fail) as table:
        for lib in libs:
            if not lib.unavailable:
                table.join(lib, "enqueue_bulk", partial(lib.bulk_enqueuer, batch=batch), batch)
        if ctx.backend == "postgres":
            multirow = partial(raw.pg_multirow_inserter, batch=batch)
            table.join_raw("raw_insert_multirow", multirow, batch)
            table.join_raw("raw_copy", partial(raw.pg_copier, batch=batch), batch)
            table.join_raw(
                "raw_copy_jobkeeper_table",
                partial(raw.pg_jobkeeper_table_copier, batch=batch),
                batch,
                prepare=migrate_jobkeeper,
            )
        else:
            many = partial(raw.sqlite_many_inserter, batch=batch)
            table.join_raw("raw_insert_multirow", many, batch)
        return table.run(ctx.sizes.bulk // batch, BULK_BLOCK, BULK_WARMUP)


class _Table:
    """The participants of one rotation, their databases and clients kept
    open until it ends."""

    def __init__(self, ctx: Context, fail: Fail) -> None:
        self.ctx = ctx
        self.fail = fail
        self.participants: list[Participant] = []
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> _Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def _join(
        self,
        lib: str,
        metric: str,
        open_block: Callable[[str], Block],
        *,
        calls: bool,
        per_call: int,
    ) -> None:
        try:
            url = self.stack.enter_context(self.ctx.fresh(f"{lib}_{metric}"))
            block = open_block(url)
        except Exception as exc:
            self.fail(lib, _metrics(metric), failure_reason(exc))
            return
        self.participants.append(Participant(lib, metric, block, calls, per_call))

    def join(
        self,
        lib: Library,
        metric: str,
        opener: Callable[[str], contextlib.AbstractContextManager[Block]],
        per_call: int = 1,
    ) -> None:
        """A library's client: its schema made, then ``opener(url)`` entered."""

        def open_block(url: str) -> Block:
            lib.prepare(url)
            return self.stack.enter_context(opener(url))

        self._join(lib.name, metric, open_block, calls=per_call == 1, per_call=per_call)

    def join_raw(
        self,
        metric: str,
        opener: Callable[[str], contextlib.AbstractContextManager[Callable[[int], float]]],
        per_call: int,
        *,
        prepare: Callable[[str], None] | None = None,
    ) -> None:
        """A raw client: its schema made (raw's tables, or ``prepare``)."""

        def open_block(url: str) -> Block:
            if prepare is not None:
                prepare(url)
            elif self.ctx.backend == "postgres":
                raw.pg_prepare(url)
            else:
                raw.sqlite_prepare(url)
            return _seconds_only(self.stack.enter_context(opener(url)))

        self._join(RAW, metric, open_block, calls=False, per_call=per_call)

    def run(self, n: int, block: int, warmup: int) -> dict[str, dict[str, float]]:
        """Every participant's ``warmup`` calls, then ``n`` calls each in turns
        of ``block``; their figures by library."""
        for participant in list(self.participants):
            self._turn(participant, warmup, timed=False)
        if self.ctx.server is not None:
            # Making the participants' databases (and dropping the last
            # rotation's) leaves pages to write back: done before the clock.
            self.ctx.server.checkpoint()
        done = 0
        order = random.Random(ORDER_SEED)
        while done < n and self.participants:
            k = min(block, n - done)
            for participant in order.sample(self.participants, len(self.participants)):
                if participant in self.participants:  # not dropped this round
                    self._turn(participant, k, timed=True)
            done += k
        figures: dict[str, dict[str, float]] = {}
        for participant in self.participants:
            try:
                figures.setdefault(participant.lib, {}).update(participant.figures(n))
            except Exception as exc:
                self.fail(participant.lib, participant.metrics(), failure_reason(exc))
        return figures

    def _turn(self, participant: Participant, k: int, *, timed: bool) -> None:
        try:
            times = participant.block(k)
        except Exception as exc:
            self.participants.remove(participant)
            self.fail(participant.lib, participant.metrics(), failure_reason(exc))
            return
        if timed:
            participant.seconds += times.seconds
            participant.durations += times.durations
