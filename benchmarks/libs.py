"""One adapter per library: how to set up its schema, enqueue, fill a backlog,
start its worker and see how much is left, each through the library's own
public API and CLI.

Every adapter opens its connections before its clock starts, so the rates
time the calls alone. The worker of every library runs one process with
concurrency 10 and otherwise its default settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks.harness import (
    NotAvailableError,
    connect_patiently,
    python_bin,
    sqlite_connect,
)

CONCURRENCY = 10
#: Extra ``jobkeeper worker`` options for the jobkeeper drain (see worker_command).
WORKER_ARGS_ENV = "JOBKEEPER_BENCH_WORKER_ARGS"
FILL_CHUNK = 10_000


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class CallTimes:
    """What ``n`` enqueue calls took: ``seconds`` from before the first call
    to after the last (the rate is ``n / seconds``, the loop included) and
    ``durations``, each call timed around it with ``time.perf_counter``, in
    seconds, in call order.
    """

    seconds: float
    durations: list[float]


def time_calls(call: Callable[[], object], n: int) -> CallTimes:
    """``call()`` ``n`` times, each timed around it."""
    durations: list[float] = []
    clock = time.perf_counter
    started = clock()
    for _ in range(n):
        before = clock()
        call()
        durations.append(clock() - before)
    return CallTimes(clock() - started, durations)


#: ``block(k)``: ``k`` more enqueue calls on an open client, timed as
#: :func:`time_calls` times them (see ``Library.single_enqueuer``).
Block = Callable[[int], CallTimes]


async def time_calls_async(call: Callable[[], Awaitable[object]], n: int) -> CallTimes:
    """``await call()`` ``n`` times, each timed around it."""
    durations: list[float] = []
    clock = time.perf_counter
    started = clock()
    for _ in range(n):
        before = clock()
        await call()
        durations.append(clock() - before)
    return CallTimes(clock() - started, durations)


class Probe:
    """A read-only connection to count what is left of a backlog."""

    def __init__(self, url: str, remaining_sql: str, finished_sql: str) -> None:
        self._remaining_sql = remaining_sql
        self._finished_sql = finished_sql
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        if url.startswith("sqlite:"):
            self._sqlite = sqlite_connect(url)
        else:
            self._pg = connect_patiently(url)

    def _scalar(self, query: str) -> int:
        if self._sqlite is not None:
            return int(self._sqlite.execute(query).fetchone()[0])
        assert self._pg is not None
        row = self._pg.execute(query).fetchone()
        return int(row[0]) if row else 0

    def remaining(self) -> int:
        return self._scalar(self._remaining_sql)

    def finished(self) -> int:
        return self._scalar(self._finished_sql)

    def execute(self, query: str) -> None:
        if self._sqlite is not None:
            self._sqlite.execute(query)
        else:
            assert self._pg is not None
            self._pg.execute(query)

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            self._pg.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Library:
    """The interface every adapter implements."""

    name = "?"
    #: Why this library cannot be measured here (None: it can).
    unavailable: str | None = None
    version: str | None = None
    #: How its worker is configured, for the report.
    worker_settings = ""
    #: Why this library has no async single-enqueue figure (None: it has one).
    no_async_single: str | None = (
        "jobkeeper only: its async API (the single enqueue above is already an async call "
        "for pgqueuer and oban; procrastinate's is its sync defer)"
    )

    def setup(self) -> None:
        """Make the library usable (install what it needs), or set ``unavailable``."""

    def prepare(self, url: str) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def single_enqueuer(self, url: str) -> Iterator[Block]:
        """Open a client on ``url``, make one warm-up call, and yield
        ``block(k)``: ``k`` enqueue calls of one no-op job each. Blocks of
        several libraries are interleaved by ``benchmarks/turns.py``.
        """
        raise NotImplementedError
        yield

    @contextlib.contextmanager
    def single_enqueuer_async(self, url: str) -> Iterator[Block]:
        """The same through the library's async API (only if ``no_async_single`` is None)."""
        raise NotAvailableError(self.no_async_single or "not implemented")
        yield

    @contextlib.contextmanager
    def bulk_enqueuer(self, url: str, batch: int) -> Iterator[Block]:
        """Open a client on ``url``, make one warm-up call, and yield
        ``block(k)``: ``k`` calls of the bulk API, ``batch`` no-op jobs each
        (only its ``seconds`` are used).
        """
        raise NotImplementedError
        yield

    def fill(self, url: str, n: int) -> None:
        """Enqueue ``n`` no-op jobs (not timed)."""
        raise NotImplementedError

    def worker_command(self, url: str) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def probe(self, url: str) -> Probe:
        raise NotImplementedError

    @contextlib.contextmanager
    def stamper(self, url: str) -> Iterator[Callable[[int, float], float | None]]:
        """Yields ``enqueue(i, t)``: one call enqueues one ``stamp`` job. It
        returns None, or, when the enqueue ran in another process, that
        process's ``time.time()`` when the call returned (the job then
        carries that process's time just before the call instead of ``t``).
        """
        raise NotImplementedError
        yield


# -- jobkeeper ------------------------------------------------------------------


class Jobkeeper(Library):
    name = "jobkeeper"
    worker_settings = f"jobkeeper worker --concurrency {CONCURRENCY}, defaults otherwise"
    no_async_single = None  # enqueue_async

    def __init__(self) -> None:
        self.version = _version("jobkeeper")

    def _queue(self, url: str) -> Any:
        from benchmarks.apps.jobkeeper_app import jq

        return jq.using(url)

    def prepare(self, url: str) -> None:
        queue = self._queue(url)
        try:
            queue.migrate()
        finally:
            queue.close()

    @contextlib.contextmanager
    def single_enqueuer(self, url: str) -> Iterator[Block]:
        queue = self._queue(url)
        try:
            queue.enqueue("noop", {})  # opens the pool
            yield lambda k: time_calls(lambda: queue.enqueue("noop", {}), k)
        finally:
            queue.close()

    @contextlib.contextmanager
    def single_enqueuer_async(self, url: str) -> Iterator[Block]:
        queue = self._queue(url)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(queue.enqueue_async("noop", {}))  # opens the async pool
            yield lambda k: loop.run_until_complete(
                time_calls_async(lambda: queue.enqueue_async("noop", {}), k)
            )
        finally:
            try:
                loop.run_until_complete(queue.aclose())
            finally:
                loop.close()
                queue.close()

    @contextlib.contextmanager
    def bulk_enqueuer(self, url: str, batch: int) -> Iterator[Block]:
        queue = self._queue(url)
        try:
            queue.enqueue("noop", {})
            yield lambda k: time_calls(lambda: queue.enqueue_many([("noop", {})] * batch), k)
        finally:
            queue.close()

    def fill(self, url: str, n: int) -> None:
        queue = self._queue(url)
        try:
            for done in range(0, n, FILL_CHUNK):
                queue.enqueue_many([("noop", {})] * min(FILL_CHUNK, n - done))
        finally:
            queue.close()

    def worker_command(self, url: str) -> tuple[list[str], dict[str, str]]:
        argv = [
            python_bin("jobkeeper"),
            "--database",
            url,
            "worker",
            "--app",
            "benchmarks.apps.jobkeeper_app:jq",
            "--concurrency",
            str(CONCURRENCY),
            # More worker options for one run, e.g. "--metrics-port 0" to
            # measure the drain with per-worker metrics counted.
            *shlex.split(os.environ.get(WORKER_ARGS_ENV, "")),
        ]
        return argv, {}

    def probe(self, url: str) -> Probe:
        return Probe(
            url,
            "SELECT count(*) FROM jobkeeper_jobs "
            "WHERE status IN ('available', 'claimed', 'running')",
            "SELECT count(*) FROM jobkeeper_jobs WHERE status = 'completed'",
        )

    @contextlib.contextmanager
    def stamper(self, url: str) -> Iterator[Callable[[int, float], None]]:
        queue = self._queue(url)
        try:
            queue.enqueue("noop", {})

            def enqueue(i: int, t: float) -> None:
                queue.enqueue("stamp", {"i": i, "t": t})

            yield enqueue
        finally:
            queue.close()


# -- procrastinate --------------------------------------------------------------


class Procrastinate(Library):
    name = "procrastinate"
    worker_settings = (
        f"procrastinate worker --concurrency {CONCURRENCY}, defaults otherwise "
        "(LISTEN/NOTIFY on, async tasks)"
    )

    def __init__(self) -> None:
        self.version = _version("procrastinate")
        if self.version is None:
            self.unavailable = "procrastinate is not installed (pip install -e '.[bench]')"

    @contextlib.contextmanager
    def _app(self, url: str) -> Iterator[Any]:
        """The benchmark app on ``url``, opened synchronously (sync connector)."""
        import procrastinate

        from benchmarks.apps import procrastinate_app

        connector = procrastinate.PsycopgConnector(conninfo=url)
        with procrastinate_app.app.replace_connector(connector) as app, app.open():
            yield app

    def prepare(self, url: str) -> None:
        with self._app(url) as app:
            app.schema_manager.apply_schema()

    def _task(self, app: Any, name: str) -> Any:
        return app.tasks[name]

    @contextlib.contextmanager
    def single_enqueuer(self, url: str) -> Iterator[Block]:
        with self._app(url) as app:
            noop = self._task(app, "noop")
            noop.defer()
            yield lambda k: time_calls(noop.defer, k)

    @contextlib.contextmanager
    def bulk_enqueuer(self, url: str, batch: int) -> Iterator[Block]:
        with self._app(url) as app:
            noop = self._task(app, "noop")
            noop.defer()
            yield lambda k: time_calls(lambda: noop.batch_defer(*([{}] * batch)), k)

    def fill(self, url: str, n: int) -> None:
        with self._app(url) as app:
            noop = self._task(app, "noop")
            for done in range(0, n, FILL_CHUNK):
                noop.batch_defer(*([{}] * min(FILL_CHUNK, n - done)))

    def worker_command(self, url: str) -> tuple[list[str], dict[str, str]]:
        argv = [
            sys.executable,
            "-m",
            "procrastinate",
            "--app",
            "benchmarks.apps.procrastinate_app.app",
            "worker",
            "--concurrency",
            str(CONCURRENCY),
        ]
        return argv, {"BENCH_DSN": url}

    def probe(self, url: str) -> Probe:
        return Probe(
            url,
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        )

    @contextlib.contextmanager
    def stamper(self, url: str) -> Iterator[Callable[[int, float], None]]:
        with self._app(url) as app:
            stamp = self._task(app, "stamp")
            self._task(app, "noop").defer()

            def enqueue(i: int, t: float) -> None:
                stamp.defer(i=i, t=t)

            yield enqueue


# -- pgqueuer -------------------------------------------------------------------


class Pgqueuer(Library):
    name = "pgqueuer"
    worker_settings = (
        "pgqueuer.run (what `pgq run` runs), defaults: batch_size 10, no extra cap "
        "(max_concurrent_tasks must be >= 2 x batch_size, so 10 cannot be set with the "
        "default batch); async entrypoints; asyncpg driver"
    )

    def __init__(self) -> None:
        self.version = _version("pgqueuer")
        if self.version is None:
            self.unavailable = "pgqueuer is not installed (pip install -e '.[bench]')"
        self.driver = "asyncpg" if importlib.util.find_spec("asyncpg") else "psycopg"

    @contextlib.asynccontextmanager
    async def _queries(self, url: str) -> Any:
        from pgqueuer import Queries

        if self.driver == "asyncpg":
            import asyncpg

            connection = await asyncpg.connect(url)
            try:
                yield Queries.from_asyncpg_connection(connection)
            finally:
                await connection.close()
        else:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                yield Queries.from_psycopg_connection(conn)

    def prepare(self, url: str) -> None:
        async def run() -> None:
            async with self._queries(url) as queries:
                await queries.install()

        asyncio.run(run())

    @contextlib.contextmanager
    def single_enqueuer(self, url: str) -> Iterator[Block]:
        with self._on_loop(url) as (loop, queries):
            yield lambda k: loop.run_until_complete(
                time_calls_async(lambda: queries.enqueue("noop", None), k)
            )

    async def _bulk(self, queries: Any, n: int, batch: int) -> None:
        for done in range(0, n, batch):
            size = min(batch, n - done)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)

    @contextlib.contextmanager
    def _on_loop(self, url: str) -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
        """Its ``Queries`` on an event loop of their own, one warm-up job in."""
        loop = asyncio.new_event_loop()
        manager = self._queries(url)
        try:
            queries = loop.run_until_complete(manager.__aenter__())
            try:
                loop.run_until_complete(queries.enqueue("noop", None))
                yield loop, queries
            finally:
                loop.run_until_complete(manager.__aexit__(None, None, None))
        finally:
            loop.close()

    @contextlib.contextmanager
    def bulk_enqueuer(self, url: str, batch: int) -> Iterator[Block]:
        with self._on_loop(url) as (loop, queries):
            yield lambda k: loop.run_until_complete(
                time_calls_async(
                    lambda: queries.enqueue(["noop"] * batch, [None] * batch, [0] * batch), k
                )
            )

    def fill(self, url: str, n: int) -> None:
        async def run() -> None:
            async with self._queries(url) as queries:
                await self._bulk(queries, n, FILL_CHUNK)

        asyncio.run(run())

    def worker_command(self, url: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "benchmarks.apps.pgqueuer_app"], {"BENCH_DSN": url}

    def probe(self, url: str) -> Probe:
        # pgqueuer deletes a job when it finishes and logs it in pgqueuer_log
        # (buffered: complete only once the worker has flushed).
        return Probe(
            url,
            "SELECT count(*) FROM pgqueuer",
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
        )

    @contextlib.contextmanager
    def stamper(self, url: str) -> Iterator[Callable[[int, float], None]]:
        with self._on_loop(url) as (loop, queries):

            def enqueue(i: int, t: float) -> None:
                payload = json.dumps({"i": i, "t": t}).encode()
                loop.run_until_complete(queries.enqueue("stamp", payload))

            yield enqueue


def peers() -> list[Library]:
    # oban's adapter builds on this module's Library: imported here, not above.
    from benchmarks.oban_lib import Oban

    return [Procrastinate(), Pgqueuer(), Oban()]
