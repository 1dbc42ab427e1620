"""The dashboard's database work, answered within a time bound (internal).

A PostgreSQL server that is frozen (SIGSTOP, a stalled host) accepts
connections and never answers; a read then blocks its thread for as long,
and a page or ``/metrics`` scrape with it (a break-test's ``curl -m 200``
waited all 200 s). A sync driver's read cannot be interrupted, so, as
``JobQueue.wait`` does (``jobkeeper.api.results._bounded``), the work runs on
a thread of its own and the request stops waiting for it after the bound:
it answers 503 and the thread is left to end when the server does.

The threads are few, reused and daemon: a reused thread keeps its SQLite
connection, a frozen server holds at most ``threads`` of them (later
requests wait in line and are answered 503 at the bound), and the process
can exit while one is stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from jobkeeper.errors import DatabaseUnavailable

#: Default bound (s) on a page's, a scrape's or an action's database work.
DATABASE_TIMEOUT = 5.0
#: Threads that run that work, at most (each may hold a database connection).
THREADS = 8
#: What keeps each backend from answering, for the 503's text.
_WHY = {
    "postgresql": "a server that accepts and never answers: frozen, or its host stalled",
    "sqlite": "another connection holds the database file's write lock; a write waits for "
    "it up to busy_timeout",
}


@dataclass(eq=False)
class _Work:
    function: Callable[[Request], Response]
    request: Request
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Response]
    abandoned: bool = field(default=False)


def _settle(future: asyncio.Future[Response], ok: bool, value: Any) -> None:
    if future.done():  # given up on: the bound passed
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class BoundedRunner:
    """Runs sync request handlers on its own threads, each answered or given
    up on within ``seconds``.

    Args:
        seconds: the bound, > 0.
        threads: threads at most.
        prepare: called on the thread before each function (a SQLite
            backend bounds the thread's lock waits there); what it raises
            goes to the request, as the function's would.
    """

    def __init__(
        self,
        seconds: float,
        threads: int = THREADS,
        *,
        backend: str = "",
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self.seconds = seconds
        self._prepare = prepare
        self._why = _WHY.get(backend, _WHY["postgresql"])
        self._threads = threads
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0
        self._queue: queue.SimpleQueue[_Work] = queue.SimpleQueue()

    async def run(
        self,
        function: Callable[[Request], Response],
        request: Request,
        *,
        action: bool = False,
    ) -> Response:
        """``function(request)`` on one of the threads. ``action``: it
        changes something (its 503 says the change may still happen).

        Raises:
            DatabaseUnavailable: no answer within ``seconds`` (the database
                does not answer, or every thread waits on it), or the
                function's own.
        """
        loop = asyncio.get_running_loop()
        work = _Work(function, request, loop, loop.create_future())
        self._submit(work)
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a
            # cancel that comes in the loop step in which the answer does.
            async with asyncio.timeout(self.seconds):
                return await work.future
        except TimeoutError:
            work.abandoned = True
            then = (
                "the action may still take effect once it answers (or was never started, "
                "if it waited behind others): reload to see"
                if action
                else "the page works again once it answers"
            )
            raise DatabaseUnavailable(
                f"the database did not answer within {self.seconds:g}s ({self._why}); {then}"
            ) from None

    def _submit(self, work: _Work) -> None:
        # _idle: threads waiting for work less work waiting for a thread.
        with self._lock:
            start = self._idle <= 0 and self._started < self._threads
            if start:
                self._started += 1
            else:
                self._idle -= 1
        self._queue.put(work)
        if start:
            threading.Thread(target=self._serve, name="jobkeeper-dashboard", daemon=True).start()

    def _serve(self) -> None:
        while True:
            work = self._queue.get()
            if not work.abandoned:
                try:
                    if self._prepare is not None:
                        self._prepare()
                    outcome: tuple[bool, Any] = (True, work.function(work.request))
                except BaseException as exc:  # noqa: BLE001 - handed to the request, raised there
                    outcome = (False, exc)
                # RuntimeError: the loop closed meanwhile, nobody to answer.
                with contextlib.suppress(RuntimeError):
                    work.loop.call_soon_threadsafe(_settle, work.future, *outcome)
            with self._lock:
                self._idle += 1
