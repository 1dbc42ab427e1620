"""Waiting for a job's result, from threads and from event loops."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from jobkeeper.api.base import QueueBase, _job_id
from jobkeeper.backends import Backend
from jobkeeper.errors import DatabaseUnavailable
from jobkeeper.waiting import Get, Mark, Ready, Sleep, check_timeout, wait_plan

T = TypeVar("T")


class _QueueClosedError(Exception):
    """The queue was closed (``JobQueue.close()``, ``aclose()``) while a wait
    used its connections: the wait goes on with the reopened ones.
    """


class ResultsMixin(QueueBase):
    """Waiting methods of :class:`~jobkeeper.JobQueue`."""

    # -- waiting for results ------------------------------------------------------------

    def wait(self, job_id: int, timeout: float | None = None) -> Any:
        """Block until the job ends; return its result if it completed.

        Woken by the end itself: on PostgreSQL by a NOTIFY that only awaited
        jobs send, heard on one connection per process however many waiters;
        on SQLite by one connection per process watching ``PRAGMA
        data_version``. A retrying job is still waited for. A completed job's
        result stays readable for ``retention`` seconds.

        Args:
            job_id: the job's id.
            timeout: seconds to wait at most; ``None`` waits for ever.

        Returns:
            The completed job's result (decoded JSON; ``None`` if it returned nothing).

        Raises:
            JobFailed: the job is dead (``.job.errors`` has every failed attempt).
            JobCancelled: the job was cancelled (``.job``).
            JobNotFound: no such job, or it finished and was pruned (``retention``).
            TimeoutError: it did not end within ``timeout``.
            DatabaseUnavailable: the database could not be reached, or did
                not answer, until the timeout ran out (at most
                ``waiting.LEAST_CALL`` seconds past it; whether the job ended
                is unknown; an outage that ends in time is waited out).
            ConfigError: a bad id or timeout.
        """
        job_id = _job_id(job_id)
        seconds = check_timeout(timeout)
        started = time.monotonic()
        while True:
            # The queue reconnects when it is used after close(): so does a
            # wait that close() cut (it waited out the closed pool for ever).
            backend = self.backend
            try:
                return _drive_wait(
                    backend, job_id, seconds, self.settings.poll_interval, started,
                    closed=self._replaced(backend),
                )  # fmt: skip
            except _QueueClosedError:
                continue

    def _replaced(self, backend: Backend) -> Callable[[], bool]:
        """Whether ``close()`` has since closed ``backend`` (the queue opens
        another when it is next used).
        """
        return lambda: self._backend is not backend

    async def wait_async(self, job_id: int, timeout: float | None = None) -> Any:
        """:meth:`wait` for async code; many may wait at once on one loop."""
        job_id = _job_id(job_id)
        seconds = check_timeout(timeout)
        started = time.monotonic()
        while True:
            backend = self.backend
            try:
                return await _drive_wait_async(
                    backend, job_id, seconds, self.settings.poll_interval, started,
                    closed=self._replaced(backend),
                )  # fmt: skip
            except _QueueClosedError:
                continue


def _drive_wait(
    backend: Backend,
    job_id: int,
    timeout: float | None,
    poll: float,
    started: float | None = None,
    *,
    closed: Callable[[], bool] = lambda: False,
) -> Any:
    """Run the wait plan on this thread (see :mod:`jobkeeper.waiting`).

    Raises:
        _QueueClosedError: ``closed()`` says the queue closed ``backend``.
    """
    watch = backend.completion_watch()
    woken = threading.Event()
    unregister = watch.register(job_id, woken.set)
    plan = wait_plan(job_id, timeout, poll, started)
    try:
        reply: Any = None
        error: DatabaseUnavailable | None = None
        while True:
            try:
                step = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as stop:
                return stop.value
            reply, error = None, None
            if isinstance(step, Mark | Get) and closed():
                # Not read on the forgotten backend: its async pool opened
                # again, and nothing closed it (break-test 137).
                raise _QueueClosedError
            try:
                if isinstance(step, Ready):
                    reply = watch.wait_ready(step.seconds)
                elif isinstance(step, Mark):
                    _bounded(lambda: backend.job_mark_awaited(job_id=job_id), _limit(backend, step))
                elif isinstance(step, Get):
                    woken.clear()
                    reply = _bounded(lambda: backend.job_get(job_id=job_id), _limit(backend, step))
            except DatabaseUnavailable as exc:
                if closed():
                    raise _QueueClosedError from None
                error = exc  # the plan waits it out until its timeout
                continue
            if isinstance(step, Sleep):
                woken.wait(step.seconds)
    finally:
        unregister()
        plan.close()


async def _drive_wait_async(
    backend: Backend,
    job_id: int,
    timeout: float | None,
    poll: float,
    started: float | None = None,
    *,
    closed: Callable[[], bool] = lambda: False,
) -> Any:
    """Run the wait plan on the event loop (see :mod:`jobkeeper.waiting`).

    Raises:
        _QueueClosedError: as :func:`_drive_wait`.
    """
    loop = asyncio.get_running_loop()
    watch = backend.completion_watch()
    woken = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(woken.set)

    unregister = watch.register(job_id, wake)
    plan = wait_plan(job_id, timeout, poll, started)
    try:
        reply: Any = None
        error: DatabaseUnavailable | None = None
        while True:
            try:
                step = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as stop:
                return stop.value
            reply, error = None, None
            if isinstance(step, Mark | Get) and closed():
                raise _QueueClosedError  # as in _drive_wait
            try:
                if isinstance(step, Ready):
                    reply = watch.ready or await watch.wait_ready_async(step.seconds)
                elif isinstance(step, Mark):
                    marking = backend.job_mark_awaited_async(job_id=job_id)
                    await _bounded_async(marking, _limit(backend, step))
                elif isinstance(step, Get):
                    woken.clear()
                    reading = backend.job_get_async(job_id=job_id)
                    reply = await _bounded_async(reading, _limit(backend, step))
            except DatabaseUnavailable as exc:
                if closed():
                    raise _QueueClosedError from None
                error = exc  # the plan waits it out until its timeout
                continue
            if isinstance(step, Sleep):
                # asyncio.timeout, not wait_for: Python 3.11's wait_for
                # returns when its inner wait ended in the loop step that
                # cancelled the caller, and the cancel is lost (a cancelled
                # wait_async without a timeout then waited for good).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(step.seconds):
                        await woken.wait()
    finally:
        unregister()
        plan.close()


def _limit(backend: Backend, step: Mark | Get) -> float:
    """How long ``step`` of a wait on ``backend`` may take: a server may hang
    (accept and never answer), a SQLite file cannot (a lock held is its
    busy_timeout's), and a bounded sync call there would open a connection
    on a thread of its own each time.
    """
    return math.inf if backend.url.scheme == "sqlite" else step.seconds


def _no_answer(seconds: float) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"the database did not answer within {seconds:.3g}s, all the wait had left "
        "(a server that accepts and never answers: frozen, or its host stalled)"
    )


def _bounded(call: Callable[[], T], seconds: float) -> T:
    """``call()``, given up after ``seconds`` (``math.inf``: never). A sync
    driver's thread cannot be interrupted in a read its server never
    answers, so the call runs on a thread of its own, left to end when the
    server does (holding its connection until then).

    Raises:
        DatabaseUnavailable: no answer within ``seconds``, or the call's own.
    """
    if math.isinf(seconds):
        return call()
    outcome: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, raised there
            outcome.append((False, exc))
        done.set()

    threading.Thread(target=run, name="jobkeeper-wait-call", daemon=True).start()
    if not done.wait(seconds):
        raise _no_answer(seconds)
    ok, value = outcome[0]
    if not ok:
        raise value
    return cast(T, value)


async def _bounded_async(call: Awaitable[T], seconds: float) -> T:
    """``await call``, given up after ``seconds`` (``math.inf``: never). The
    call is cancelled and left to end in the background: psycopg then asks
    the server to cancel the query, waits for that a while, and closes the
    connection, which ``asyncio.wait_for`` would wait out.

    Raises:
        DatabaseUnavailable: no answer within ``seconds``, or the call's own.
    """
    if math.isinf(seconds):
        return await call
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        # Its end (the cancellation, or an error) is nobody's to report.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise _no_answer(seconds)
    return task.result()
