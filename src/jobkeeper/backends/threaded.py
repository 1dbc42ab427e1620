"""The async producer API of a backend whose driver only blocks (internal):
SQLite's. Each call runs the sync method on a small thread pool of the
backend, so the event loop never waits on the file lock or an fsync.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from jobkeeper.database_url import DatabaseURL
from jobkeeper.errors import DatabaseUnavailable
from jobkeeper.models import Job, NewJob

T = TypeVar("T")

#: Threads per backend for async calls: SQLite takes one writer at a time,
#: so more would only queue on the lock.
ASYNC_THREADS = 4


class ThreadedAsync:
    """Async methods that run the sync ones on a private thread pool."""

    url: DatabaseURL
    _async_executor: concurrent.futures.ThreadPoolExecutor | None = None
    #: The process that made ``_async_executor``: a forked child has none
    #: of its threads (see :meth:`_executor`).
    _async_executor_pid = 0
    _async_executor_lock = threading.Lock()

    def job_insert_many(self, *, jobs: Sequence[NewJob], connection: Any = None) -> list[Job]:
        raise NotImplementedError

    def job_get(self, *, job_id: int) -> Job | None:
        raise NotImplementedError

    def job_mark_awaited(self, *, job_id: int) -> None:
        raise NotImplementedError

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The pool, made on first use, and again in a forked child: the
        parent's pool came over without its threads, and counted the
        parent's idle ones as its own, so it started none and every async
        call of a child whose parent had made one waited for good.
        """
        executor, pid = self._async_executor, os.getpid()
        if executor is None or self._async_executor_pid != pid:
            with self._async_executor_lock:
                executor = self._async_executor
                if executor is None or self._async_executor_pid != pid:
                    executor = self._async_executor = concurrent.futures.ThreadPoolExecutor(
                        ASYNC_THREADS, thread_name_prefix="jobkeeper-async"
                    )
                    self._async_executor_pid = pid
        return executor

    def _submit(self, call: Callable[[], T]) -> concurrent.futures.Future[T]:
        """``call`` submitted to the pool.

        Raises:
            DatabaseUnavailable: ``aclose()`` or ``close()`` (another
                thread's) stopped the pool while this call was sent to it.
        """
        executor = self._executor()
        try:
            return executor.submit(call)
        except RuntimeError:
            if self._async_executor is executor:
                raise  # the interpreter is shutting down: its own words
            raise DatabaseUnavailable(
                f"the async threads for {self.url.redacted()} were stopped (JobQueue.close() "
                "or aclose()) while the call was sent to them; nothing of it was written, "
                "and a later call starts them again"
            ) from None

    async def _in_thread(self, call: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._submit(call))

    async def _write_in_thread(self, call: Callable[[], T]) -> T:
        """:meth:`_in_thread` for a write, whose outcome is settled when a
        cancelled caller sees its ``CancelledError``: a write not yet started
        never runs; one started (a thread cannot be stopped) is waited for,
        committed or rolled back. Abandoned, it committed after the caller's
        cancel, even after ``asyncio.run()`` had returned, so a caller that
        looked, found nothing and enqueued again had the job twice.
        """
        started = self._submit(call)
        result = asyncio.wrap_future(started)
        try:
            return await asyncio.shield(result)
        except asyncio.CancelledError:
            if started.cancel():
                raise
            while not result.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({result})
            if not result.cancelled():
                result.exception()  # retrieved: the cancel is the caller's news
            raise

    async def job_insert_many_async(
        self, *, jobs: Sequence[NewJob], connection: Any = None
    ) -> list[Job]:
        if connection is not None:
            # A sqlite3 connection belongs to the thread that made it (and
            # the caller's transaction is open on it): written here, a local
            # write to a file the caller already holds.
            return self.job_insert_many(jobs=jobs, connection=connection)
        return await self._write_in_thread(functools.partial(self.job_insert_many, jobs=jobs))

    async def job_get_async(self, *, job_id: int) -> Job | None:
        return await self._in_thread(functools.partial(self.job_get, job_id=job_id))

    async def job_mark_awaited_async(self, *, job_id: int) -> None:
        await self._in_thread(functools.partial(self.job_mark_awaited, job_id=job_id))

    async def aclose(self) -> None:
        """Stop the async threads (the sync ``close`` closes the connections).
        Calls already sent to them still run; one being sent meanwhile
        raises ``DatabaseUnavailable`` (see :meth:`_submit`), and the next
        call starts new threads.
        """
        with self._async_executor_lock:
            executor, self._async_executor = self._async_executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the lock when it forked.
    ThreadedAsync._async_executor_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
