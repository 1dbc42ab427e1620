"""Why a pool gave no connection (internal): its new sessions failing
jobkeeper's set-up of them, told apart from a busy pool.

A session the server opens but whose set-up fails (``session_setup``: with
``ALTER DATABASE ... SET statement_timeout = '1ms'`` its first statement is
cancelled) is dropped by psycopg_pool, which logs a WARNING and tries again
later. The server answers the probe's plain connect, so every call waited
out the pool's 10 s and failed "all 10 stayed in use (JobQueue's
pool_size)", on a pool that had opened none. The pools count the set-ups
that failed in a row (:class:`SetupFailures`); while some have, the probe
that runs after each empty slice of the wait sets its own session up too,
and raises what that set-up meets (:class:`SessionSetupFailed`). The async
pools' probe (:class:`ServerProbe`) lives here with the sync one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from jobkeeper.backends.postgres.settling import finish


class SessionSetupFailed(psycopg.OperationalError):
    """Every new session of a pool failed jobkeeper's set-up of it, and so did
    the probe's: the server is up, but its sessions cannot be used.
    """


#: What ends a set-up without refusing it: the server closed the session for
#: sitting idle between its connect and its set-up (a pool thread held back
#: by a busy process, under a short ``idle_session_timeout``). Counted as
#: a refusal, one of these made the probe blame "a setting of the database".
CLOSED_IDLE = (psycopg.errors.IdleSessionTimeout, psycopg.errors.IdleInTransactionSessionTimeout)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class SetupFailures:
    """The set-ups of a pool's new sessions that failed since one last
    succeeded (its ``configure`` reports each), and the last one's error.
    """

    __slots__ = ("last", "streak")

    def __init__(self) -> None:
        self.streak = 0
        self.last: BaseException | None = None

    def failed(self, error: BaseException) -> None:
        if isinstance(error, CLOSED_IDLE):
            return  # not a refusal (see CLOSED_IDLE)
        self.streak += 1
        self.last = error

    def succeeded(self) -> None:
        self.streak = 0
        self.last = None

    def refusal(self, error: BaseException) -> SessionSetupFailed | None:
        """The error for a probe whose own session's set-up failed with
        ``error``; None when ``error`` is no refusal (see CLOSED_IDLE): the
        server is up and took the session.
        """
        if isinstance(error, CLOSED_IDLE):
            return None
        return SessionSetupFailed(
            f"no new session could be set up: {_first_line(error)} (jobkeeper's set-up "
            f"of each new session failed; the pool's last {self.streak} in a row did too: "
            "a setting of the database or role, such as a statement_timeout, may refuse it)"
        )


def busy_pool_message(
    timeout: float, pool: ConnectionPool[Any] | AsyncConnectionPool[Any], failures: SetupFailures
) -> str:
    """Why a checkout from ``pool`` gave up with the server up, after
    ``timeout`` s: the whole wait, not the pool's last slice of it, as the
    pool's own accounting (``get_stats()``) and ``failures`` tell it. "All
    in use" only when the pool had all its connections.
    """
    max_size = pool.max_size
    stats = pool.get_stats()
    waited = f"no pooled connection came free within {timeout:g} s"
    last = failures.last
    if failures.streak and last is not None:
        return (
            f"{waited}: the pool's new sessions failed jobkeeper's set-up of them "
            f"({_first_line(last)}; {failures.streak} in a row)"
        )
    size = stats.get("pool_size", max_size)
    if size < max_size:
        return (
            f"{waited}: the pool had {size} of its {max_size} connections (JobQueue's "
            f"pool_size) open or opening, none free, and opened no more"
        )
    return f"{waited}: all {max_size} stayed in use (JobQueue's pool_size)"


SyncSetUp = Callable[[psycopg.Connection[Any]], None]


def configured(configure: SyncSetUp, failures: SetupFailures) -> SyncSetUp:
    """``configure`` (a pool's, sync), reporting to ``failures``."""

    def counted(conn: psycopg.Connection[Any]) -> None:
        try:
            configure(conn)
        except Exception as exc:
            failures.failed(exc)
            raise
        failures.succeeded()

    return counted


def probe(
    conninfo: str, options: dict[str, Any], configure: SyncSetUp, failures: SetupFailures
) -> None:
    """The sync pool's probe: connect directly once (raising libpq's reason
    when the server is unreachable), and while the pool's new sessions fail
    their set-up, set this one up too.

    Raises:
        psycopg.OperationalError: the connect failed.
        SessionSetupFailed: the set-up failed.
    """
    conn = psycopg.connect(conninfo, **options)
    try:
        if failures.streak:
            try:
                configure(conn)
            except psycopg.Error as exc:
                refused = failures.refusal(exc)
                if refused is not None:
                    raise refused from exc
    finally:
        conn.close()


class ServerProbe:
    """Whether an async pool's server may be gone, and one direct connect at
    a time to find out (the sync pool's ``_probe``, for a loop's many tasks:
    500 concurrent enqueues must not open 500 probe connections).

    While the pool's new sessions fail jobkeeper's set-up of them, the probe
    sets its session up too, and raises what that meets (see pool_setup).

    Args:
        conninfo: where the pool connects.
        options: what the pool's connections are opened with.
        configure: the pool's set-up of a new session.
        failures: the pool's set-ups that failed in a row.
    """

    def __init__(
        self,
        conninfo: str,
        options: dict[str, Any],
        configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
        failures: SetupFailures,
    ) -> None:
        self._conninfo = conninfo
        self._options = options
        self._configure = configure
        self.failures = failures
        #: Probe before the first checkout, as the sync pool does.
        self.suspect = True
        self._lock = asyncio.Lock()
        # (when, error) of the last failed probe: tasks that waited for it
        # share its answer instead of each connecting in turn.
        self._failed: tuple[float, psycopg.OperationalError] | None = None

    async def _set_up(self, probe: psycopg.AsyncConnection[Any]) -> None:
        if self.failures.streak:
            try:
                await self._configure(probe)
            except psycopg.Error as exc:
                refused = self.failures.refusal(exc)
                if refused is not None:
                    raise refused from exc

    async def check(self) -> None:
        """Connect directly once, unless another task's probe just succeeded
        (or just failed: its error is raised again).

        Raises:
            psycopg.OperationalError: the server refused the connection.
            SessionSetupFailed: the probe's session failed its set-up, as
                the pool's had.
        """
        asked = time.monotonic()
        async with self._lock:
            if not self.suspect:
                return
            if self._failed is not None and self._failed[0] >= asked:
                raise self._failed[1]
            try:
                probe = await psycopg.AsyncConnection.connect(self._conninfo, **self._options)
                try:
                    await self._set_up(probe)
                finally:
                    await finish(probe.close())
            except psycopg.OperationalError as exc:
                self._failed = (time.monotonic(), exc)
                raise
            self.suspect = False
            self._failed = None
