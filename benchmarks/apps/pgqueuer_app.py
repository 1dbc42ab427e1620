"""pgqueuer entrypoints for the benchmark worker.

Run as ``python -m pgqueuer run benchmarks.apps.pgqueuer_app:create``; the
database is ``$BENCH_DSN``. asyncpg is used when installed (pgqueuer's own
default driver), psycopg otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pgqueuer import PgQueuer
from pgqueuer.models import Job

from benchmarks.apps.stamps import record


def dsn() -> str:
    return os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def register(pgq: PgQueuer) -> None:
    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @pgq.entrypoint("stamp")
    async def stamp(job: Job) -> None:
        args = json.loads(job.payload or b"{}")
        record(args["i"], args["t"])


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    try:
        import asyncpg
    except ImportError:
        asyncpg = None
    if asyncpg is not None:
        connection = await asyncpg.connect(dsn())
        try:
            pgq = PgQueuer.from_asyncpg_connection(connection)
            register(pgq)
            yield pgq
        finally:
            await connection.close()
    else:
        import psycopg

        async with await psycopg.AsyncConnection.connect(dsn(), autocommit=True) as conn:
            pgq = PgQueuer.from_psycopg_connection(conn)
            register(pgq)
            yield pgq


def main() -> None:
    """What ``pgq run benchmarks.apps.pgqueuer_app:create`` does, without its CLI.

    ``pgq run`` (pgqueuer 1.6.0) fails at start with typer 0.29, the version
    jobkeeper installs (``AttributeError: 'str' object has no attribute
    'name'`` in ``setup_fancy_logger``), so the benchmark runs the same
    supervisor (``pgqueuer.run``) with the same defaults (batch size 10,
    continuous mode), log level and event loop (uvloop when installed).
    """
    import asyncio

    from pgqueuer import run
    from pgqueuer.core import logconfig

    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)
    coroutine = run(create)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


if __name__ == "__main__":
    main()
