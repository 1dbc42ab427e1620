"""A cancelled ``enqueue_async`` against a server that answers nothing (frozen:
SIGSTOP, or a cut network). psycopg sends the cancel request, waits for it,
then closes the connection; the statement it had sent sits in the server's
socket buffer and may run when the server thaws, after the caller saw the
cancel. The docs said a cancelled enqueue was always settled; the caller is
now told it may commit (a note on the CancelledError and a WARNING).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

import pytest
from benchmarks.soak.pg import PrivatePostgres

from jobkeeper import JobQueue
from jobkeeper.backends.postgres.aio import UNSETTLED

pytestmark = pytest.mark.slow


@pytest.fixture
def server() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(database="unconfirmed")
    try:
        pg.init()
        yield pg
    finally:
        pg.cleanup()


def test_an_enqueue_cancelled_while_the_server_is_frozen_says_it_may_still_commit(server, caplog):
    jq = JobQueue(server.url, external_tasks=True)
    jq.migrate()
    caught: list[BaseException] = []

    async def main() -> None:
        await jq.enqueue_async("x", {"warm": True})  # the loop's pool holds a connection
        server.signal_all(signal.SIGSTOP)
        try:
            await asyncio.wait_for(jq.enqueue_async("x", {"frozen": True}), 1)
        except TimeoutError as exc:
            caught.append(exc)
        finally:
            server.signal_all(signal.SIGCONT)
        await jq.aclose()

    try:
        with caplog.at_level(logging.WARNING, logger="jobkeeper"):
            asyncio.run(main())
        (timeout,) = caught
        cancelled = timeout.__cause__ or timeout.__context__
        assert isinstance(cancelled, asyncio.CancelledError), repr(cancelled)
        assert any(UNSETTLED in note for note in getattr(cancelled, "__notes__", [])), cancelled
        warned = [r for r in caplog.records if r.name.startswith("jobkeeper")]
        assert any(UNSETTLED in r.getMessage() for r in warned), [r.getMessage() for r in warned]
    finally:
        server.signal_all(signal.SIGCONT)
        jq.close()


def test_an_enqueue_cancelled_while_the_server_answers_says_nothing(server, caplog):
    """The usual cancel: settled (committed whole or not at all), no warning."""
    jq = JobQueue(server.url, external_tasks=True)
    jq.migrate()

    async def main() -> None:
        await jq.enqueue_async("x", {"warm": True})
        for _ in range(20):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(jq.enqueue_many_async([("x", {})] * 200), 0.001)
        await jq.aclose()

    try:
        with caplog.at_level(logging.WARNING, logger="jobkeeper"):
            asyncio.run(main())
        assert not [r for r in caplog.records if UNSETTLED in r.getMessage()]
    finally:
        jq.close()
