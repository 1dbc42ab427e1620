"""The enqueue side of the oban measurements, run by ``.venv-oban``'s Python
(>= 3.12) on behalf of the 3.11 harness (``benchmarks/libs.py``, class
``Oban``). Each command prints one JSON object on its last stdout line.

    python -m benchmarks.apps.oban_adapter fill URL N          {"enqueued": n}
    python -m benchmarks.apps.oban_adapter stamper URL         (see below)
    python -m benchmarks.apps.oban_adapter blocks URL [BATCH]  (see below)
    python -m benchmarks.apps.oban_adapter version             {"oban": v, "python": v}

The client is what oban's docs show: ``pool = await Oban.create_pool(dsn)``
(psycopg ``AsyncConnectionPool``, 1-10 connections), ``oban = Oban(pool=pool)``
with no queues (client mode), ``await oban.enqueue(Noop.new())`` for one job
and ``await oban.enqueue_many(jobs)`` for many. The instance is not started:
enqueueing needs only the pool, and a started client would run oban's stager
(a query a second) and a LISTEN connection beside the timed calls. The event
loop is uvloop (an oban dependency, which oban's CLI runs on too).

Rates are timed here, after the pool is open and one warm-up job is in, so
the interpreter's start-up and the pipes are not in them.

``stamper`` serves the latency measurement over pipes: it prints ``ready``
once its pool is open (and one warm-up ``Noop`` is in), then for each line
``<i> <t>`` on stdin enqueues ``Stamp(i=i, t=now)`` and prints ``ok <now>``
once the insert has committed; end of input ends it. Both times are its own
``time.time()`` just before the enqueue call and just after it returned (the
caller's ``<t>`` is ignored), so the pipe's hops between the harness and this
process (0.2 ms typically, a few ms on a busy 2-core machine) are in neither
the latency nor the pickup figure: what is measured is what a caller of
``oban.enqueue`` in this process would see, as for the other libraries.

``blocks`` serves the rotations of ``benchmarks/turns.py`` the same way:
``ready`` once its pool is open and one warm-up job is in, then for each line
``<k>`` it makes ``k`` enqueue calls of one job, each timed around it, and
prints ``{"seconds": s, "durations": [s, ...]}`` (from before the first call
to after the last; each call's, in call order) on one line; end of input
ends it. With ``BATCH``, each call is an ``enqueue_many`` of ``BATCH`` jobs
and only ``{"seconds": s}`` is printed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

FILL_CHUNK = 10_000


def _run(main: Callable[[], Awaitable[Any]]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


async def _client(url: str) -> tuple[Any, Any]:
    from oban import Oban

    pool = await Oban.create_pool(url)
    return pool, Oban(pool=pool)


async def _calls(oban: Any, n: int) -> dict[str, Any]:
    """``n`` enqueue calls of one Noop, each timed around it."""
    from benchmarks.apps.oban_app import Noop

    durations: list[float] = []
    clock = time.perf_counter
    started = clock()
    for _ in range(n):
        before = clock()
        await oban.enqueue(Noop.new())
        durations.append(clock() - before)
    return {"seconds": clock() - started, "durations": durations}


async def _blocks(url: str, batch: int | None) -> dict[str, int]:
    from benchmarks.apps.oban_app import Noop

    pool, oban = await _client(url)
    served = 0
    try:
        await oban.enqueue(Noop.new())
        print("ready", flush=True)
        for line in sys.stdin:  # blocking reads: see _stamper
            k = int(line)
            if batch is None:
                answer = await _calls(oban, k)
            else:
                started = time.perf_counter()
                await _insert_all(oban, k * batch, batch)
                answer = {"seconds": time.perf_counter() - started}
            print(json.dumps(answer), flush=True)
            served += 1
        return {"served": served}
    finally:
        await pool.close()


async def _insert_all(oban: Any, n: int, batch: int) -> None:
    from benchmarks.apps.oban_app import Noop

    for done in range(0, n, batch):
        await oban.enqueue_many([Noop.new() for _ in range(min(batch, n - done))])


async def _fill(url: str, n: int) -> dict[str, int]:
    pool, oban = await _client(url)
    try:
        await _insert_all(oban, n, FILL_CHUNK)
        return {"enqueued": n}
    finally:
        await pool.close()


async def _stamper(url: str) -> dict[str, int]:
    from benchmarks.apps.oban_app import Noop, Stamp

    pool, oban = await _client(url)
    served = 0
    try:
        await oban.enqueue(Noop.new())
        print("ready", flush=True)
        # Blocking reads are fine: nothing else runs on this loop (the
        # instance is not started) and the caller waits for each reply.
        for line in sys.stdin:
            i = int(line.split()[0])
            t = time.time()
            await oban.enqueue(Stamp.new({"i": i, "t": t}))
            print(f"ok {time.time()!r}", flush=True)
            served += 1
        return {"served": served}
    finally:
        await pool.close()


def _version() -> dict[str, str]:
    """Versions, after importing oban and the benchmark's workers (a smoke test)."""
    import oban  # noqa: F401

    import benchmarks.apps.oban_app  # noqa: F401

    return {"oban": importlib.metadata.version("oban"), "python": platform.python_version()}


def main(argv: list[str]) -> int:
    command, *rest = argv
    if command == "fill":
        result = _run(lambda: _fill(rest[0], int(rest[1])))
    elif command == "stamper":
        result = _run(lambda: _stamper(rest[0]))
    elif command == "blocks":
        result = _run(lambda: _blocks(rest[0], int(rest[1]) if len(rest) > 1 else None))
    elif command == "version":
        result = _version()
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
