"""Cancels that cannot leave the async pool's connections unsettled
(internal): a cancelled statement's cancel request and the wait for the
server's answer, and a connection's return to its pool, both run to their
end however often the caller is cancelled meanwhile.

psycopg's ``AsyncConnection.wait`` answers a cancelled task by sending the
server a cancel request and waiting for the statement's end, but both awaits
are open to the next cancel: a second ``task.cancel()`` then (anyio's cancel
scopes, Starlette and FastAPI's, cancel again at every loop step) made it
close the connection without the request sent. The server, waiting on a
lock for the autocommitted INSERT, never noticed, and committed the job
once the lock was released: after the caller had seen the cancel.

psycopg_pool's ``putconn`` waits on the pool's lock; a cancel arriving
there left the connection neither in the pool nor closed, and the pool
counted the slot as used for the loop's life: rounds of 20 concurrent
enqueues under 0-3 ms deadlines left 9 of 10 slots held by nobody, and
then every call waited out the pool's timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

import psycopg
from psycopg import pq, waiting
from psycopg.abc import PQGen
from psycopg.rows import Row

logger = logging.getLogger("jobkeeper.postgres")

RV = TypeVar("RV")

#: Seconds the cancel request may take to reach the server (psycopg's own).
CANCEL_REQUEST_TIMEOUT = 5.0
#: Seconds, from the cancel, within which the server must answer the
#: cancelled statement (psycopg waits 5 s more after its 5 s request).
CANCEL_SETTLE_TIMEOUT = 10.0
#: psycopg's interval for its waits (``connection_async._WAIT_INTERVAL``).
_WAIT_INTERVAL = 0.1
#: The connection attribute naming why a cancelled statement was not settled.
_UNSETTLED = "_jobkeeper_unsettled"

#: Returns and closes under way (see :func:`finish`): asyncio keeps only a
#: weak reference to a task, which the collector could take mid-return.
_FINISHING: set[asyncio.Task[Any]] = set()


async def finish(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` (a connection's return to its pool, or its close) to its
    end even if the caller is cancelled meanwhile: in a task of its own that
    the caller's cancel does not reach. The cancel still reaches the caller
    at once; the work goes on without it.
    """
    task = asyncio.ensure_future(work)
    _FINISHING.add(task)
    task.add_done_callback(_FINISHING.discard)
    await asyncio.shield(task)


def unsettled_reason(conn: psycopg.AsyncConnection[Any]) -> str | None:
    """Why a cancelled statement on ``conn`` may still commit (None: it was
    settled, or nothing was cancelled on it).
    """
    reason: str | None = getattr(conn, _UNSETTLED, None)
    return reason


class SettlingConnection(psycopg.AsyncConnection[Row]):
    """The async pool's connection: its ``wait`` (what every statement's I/O
    goes through, psycopg's cursors' and :mod:`.direct`'s) settles a
    cancelled statement under a shield: the cancel request, then the wait
    for the statement's end (cancelled, failed or even committed), bounded
    by ``CANCEL_SETTLE_TIMEOUT``. Later cancels of the task are absorbed
    until then; the first ``CancelledError`` is raised after.
    """

    async def wait(
        self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL, timeout: float | None = None
    ) -> RV:
        try:
            if timeout is None:
                return await waiting.wait_async(gen, self.pgconn.socket, interval=interval)
            return await waiting.wait_async(
                gen, self.pgconn.socket, interval=interval, timeout=timeout
            )
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            if self.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                await self._settle_shielded(gen, interval)
            raise

    async def _settle_shielded(self, gen: PQGen[Any], interval: float) -> None:
        settling = asyncio.ensure_future(self._settle(gen, interval))
        while not settling.done():
            try:
                await asyncio.shield(settling)
            except asyncio.CancelledError:
                # A cancel after the first (anyio re-cancels every step):
                # the caller gets one CancelledError once this is settled.
                # A settle cancelled itself (the loop ending) is done.
                continue
            except Exception:  # noqa: BLE001 -- _settle says its outcome on the connection
                break

    async def _cancel_and_wait(self, gen: PQGen[Any], interval: float, bound: float) -> None:
        """Send the cancel request, then wait for the statement's end, all
        within ``bound`` seconds (``TimeoutError`` past it).

        Raises:
            psycopg.Error: the statement's own end (QueryCanceled, another
                error), or the connection lost.
        """
        async with asyncio.timeout(bound):
            try:
                await self.cancel_safe(timeout=CANCEL_REQUEST_TIMEOUT)
            except psycopg.Error as exc:
                # Not sent (a CancellationTimeout): the statement may still
                # end within the bound, which settles it all the same.
                logger.debug("cancel request failed: %s", exc)
            # Whatever the statement ends in -- cancelled, refused, or
            # committed just before the cancel reached it -- is settled.
            await waiting.wait_async(gen, self.pgconn.socket, interval=interval)

    async def _settle_at_loop_end(self, gen: PQGen[Any], interval: float) -> bool:
        """The settle once more, within ``CANCEL_REQUEST_TIMEOUT``, its task's
        cancel withdrawn; whether the statement ended (cancelled or not).
        """
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        try:
            await self._cancel_and_wait(gen, interval, CANCEL_REQUEST_TIMEOUT)
        except psycopg.Error:
            return self.pgconn.status == pq.ConnStatus.OK  # the statement's own end
        except (TimeoutError, asyncio.CancelledError):
            return False
        return True

    async def _settle(self, gen: PQGen[Any], interval: float) -> None:
        """Send the cancel request and wait for the statement's end; on
        failure, close the connection and note why (``unsettled_reason``).
        """
        reason: str | None = None
        try:
            await self._cancel_and_wait(gen, interval, CANCEL_SETTLE_TIMEOUT)
        except TimeoutError:
            reason = (
                f"the database answered neither this enqueue's statement nor its cancel "
                f"within {CANCEL_SETTLE_TIMEOUT:g} s (a frozen server or a cut network)"
            )
        except asyncio.CancelledError:
            # Only the loop's end cancels this task itself (callers meet the
            # shield), and asyncio.run() then waits for it: the cancel request
            # still goes, bounded. Given up at once, a statement waiting on a
            # lock committed once the lock was released (break-test 137).
            if not await self._settle_at_loop_end(gen, interval):
                reason = (
                    "the event loop ended (its tasks were cancelled) before the database "
                    "answered this enqueue's cancel"
                )
            raise
        except psycopg.Error as exc:
            # Usually the server's answer (QueryCanceled, or another error the
            # statement ended in): settled. Lost, the session's end is unknown.
            if self.pgconn.status != pq.ConnStatus.OK:
                reason = f"the connection was lost while this enqueue's cancel settled ({exc})"
        finally:
            if reason is not None:
                setattr(self, _UNSETTLED, reason)
                self.pgconn.finish()
