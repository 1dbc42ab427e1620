"""``JobQueue``: the facade users hold. Validates every input before anything
is written, then delegates to a backend (River's ``Client``, Oban's ``Oban``).
Its methods live in one mixin per concern (this package's modules); this
class holds the construction, the connection's lifecycle and the tasks.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar, overload

from jobkeeper.api.base import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    _external_tasks,
    _TaskDecorator,
)
from jobkeeper.api.enqueue import EnqueueMixin
from jobkeeper.api.flow_control import FlowControlMixin
from jobkeeper.api.operations import OperationsMixin
from jobkeeper.api.periodics import PeriodicsMixin
from jobkeeper.api.results import ResultsMixin
from jobkeeper.api.running import RunningMixin
from jobkeeper.backends import Backend, resolve_database_url
from jobkeeper.config import DEFAULT_MAX_CRASHES, MIGRATE_LOCK_WAIT, Settings, check_seconds
from jobkeeper.errors import ConfigError, shown
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.tasks import Task
from jobkeeper.tracing import Tracing

P = ParamSpec("P")
R = TypeVar("R")


class JobQueue(
    EnqueueMixin, ResultsMixin, OperationsMixin, FlowControlMixin, RunningMixin, PeriodicsMixin
):
    """A durable job queue on one database.

    Creating one connects to nothing; the first call that needs the database
    does. Thread-safe: API calls may come from any thread (on PostgreSQL they
    share a small connection pool).

    Args:
        database_url: ``sqlite:///path.db`` or ``postgresql://user@host:port/db``;
            default: ``$JOBKEEPER_DATABASE_URL``, else ``sqlite:///jobkeeper.db``.
        heartbeat_interval: seconds between worker heartbeats (default 5).
        rescue_after: seconds without a heartbeat before a running job is
            rescued (default 60; at least 3 x ``heartbeat_interval``; 5 x or more
            recommended).
        poll_interval: seconds an idle worker waits between looks for due
            work when no wake-up arrives (default 1).
        retention: seconds completed and cancelled jobs are kept (default
            86400; 0 deletes them at completion).
        max_payload_bytes: largest encoded args or result, bytes (default 1 MiB).
        shutdown_grace: seconds running jobs get to finish after SIGTERM (default 30).
        backoff_base: base of the exponential retry backoff (default 2).
        max_backoff: cap on one retry delay, seconds (default 86400).
        busy_timeout: SQLite: seconds to wait for the write lock (default 30).
        pool_size: PostgreSQL: most pooled connections for API calls (default 10).
        max_crashes: the crash budget (default 2): a job rescued from a
            worker that went silent while running it runs its next attempt
            alone on its worker, so a crash then is pinned on it; after this
            many pinned crashes it goes to the dead letters ("crashed its
            worker N times"), attempts left or not. A task's
            ``max_crashes`` wins. Decided by the rescuing worker, from its
            own app's task (else this setting).
        dead_retention: seconds dead letters are kept before the workers'
            pruner deletes them (default None: kept until ``jobkeeper dead
            purge`` or :meth:`purge_dead`).
        external_tasks: names of tasks this queue enqueues but another
            service's workers run (``True``: any name). Once this queue has
            tasks registered, :meth:`enqueue` refuses any other name (a typo
            would make a job no worker runs) unless it is listed here or the
            call passes ``external=True``.
        tracing: OpenTelemetry spans for enqueues and executions (see
            :mod:`jobkeeper.tracing`; needs ``pip install 'jobkeeper[otel]'``).
            ``False`` (default): none, at no cost. ``True``: spans from the
            global tracer provider. An OpenTelemetry ``TracerProvider``:
            spans from that one. Set it on the queue the enqueuers use and
            on the one the worker runs (``--app``), or the traces do not join.

    Raises:
        ConfigError: an invalid URL or setting (nothing is connected), or
            ``tracing`` asked for without ``opentelemetry-api`` installed.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        heartbeat_interval: float = 5.0,
        rescue_after: float = 60.0,
        poll_interval: float = 1.0,
        retention: float = 86_400.0,
        max_payload_bytes: int = 1 << 20,
        shutdown_grace: float = 30.0,
        backoff_base: float = 2.0,
        max_backoff: float = 86_400.0,
        busy_timeout: float = 30.0,
        pool_size: int = 10,
        max_crashes: int = DEFAULT_MAX_CRASHES,
        dead_retention: float | None = None,
        external_tasks: Iterable[str] | bool = (),
        tracing: bool | Any = False,
    ) -> None:
        self.url = resolve_database_url(database_url)
        self.settings = Settings(
            heartbeat_interval=heartbeat_interval,
            rescue_after=rescue_after,
            poll_interval=poll_interval,
            retention=retention,
            max_payload_bytes=max_payload_bytes,
            shutdown_grace=shutdown_grace,
            backoff_base=backoff_base,
            max_backoff=max_backoff,
            busy_timeout=busy_timeout,
            pool_size=pool_size,
            max_crashes=max_crashes,
            dead_retention=dead_retention,
        )
        self.tasks: dict[str, Task[Any, Any]] = {}
        #: Task names enqueued here but run by another service's workers
        #: (True: any name); see :meth:`enqueue`'s ``external``.
        self.external_tasks: frozenset[str] | bool = _external_tasks(external_tasks)
        #: The periodic jobs registered with :meth:`periodic`, by name.
        self.periodics = self._new_periodic_registry()
        #: Listeners of this queue's job events (see :meth:`on_event`).
        self.events = EventBus()
        self._tracing = _open_tracing(tracing)
        if self._tracing is not None:
            self.events.subscribe(self._tracing, self._tracing.kinds)
        self._backend: Backend | None = None
        self._backend_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JobQueue {self.url.redacted()} tasks={sorted(self.tasks)}>"

    def using(self, database_url: str) -> JobQueue:
        """A JobQueue on another database with the same settings and tasks.

        The tasks are shared, not copied: ``task.enqueue()`` still goes to the
        database of the queue they were registered on. To run an app's worker
        on another database, let the app create ``JobQueue()`` and set
        ``JOBKEEPER_DATABASE_URL`` (what ``jobkeeper --database URL worker``
        does), so follow-up jobs its tasks enqueue land there too.
        """
        other = JobQueue.__new__(JobQueue)
        other.url = resolve_database_url(database_url)
        other.settings = self.settings
        other.tasks = self.tasks
        other.external_tasks = self.external_tasks
        other.periodics = self.periodics
        other.events = self.events
        other._tracing = self._tracing
        other._backend = None
        other._backend_lock = threading.Lock()
        return other

    def use_database(self, database_url: str) -> None:
        """Point this queue, and so every task registered on it, at another
        database; its open connections are closed first.

        What ``jobkeeper --database URL worker --app ...`` does to the app's
        queue: follow-up jobs that tasks enqueue go to the database the worker
        serves.

        Raises:
            ConfigError: an invalid URL (the queue is left as it was).
        """
        url = resolve_database_url(database_url)
        self.close()
        self.url = url

    def __enter__(self) -> JobQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_event(
        self, listener: Callable[[JobEvent], None], kinds: Iterable[EventKind] | None = None
    ) -> Callable[[], None]:
        """Call ``listener`` with every :class:`~jobkeeper.JobEvent` of the
        workers this queue runs (claimed, started, finished, acked, claim
        lost) and of their rescuers (rescued, dead-lettered).

        The listener runs on the worker's own threads: it must be quick and
        must not block. One that raises is logged and skipped, never breaking
        the worker. Nobody listening costs the worker nothing measurable. The
        model is Oban's telemetry events (``oban-bg/oban:lib/oban/telemetry.ex``).

        Args:
            listener: a callable taking one ``JobEvent``.
            kinds: the :class:`~jobkeeper.EventKind` values it wants (default:
                all); events nobody wants are never built.

        Returns:
            A function that removes the listener again.

        Raises:
            TypeError: ``listener`` is not callable.
        """
        return self.events.subscribe(listener, kinds)

    # -- schema ----------------------------------------------------------------

    def migrate(self, *, lock_wait: float = MIGRATE_LOCK_WAIT) -> int:
        """Create or upgrade the schema; idempotent and safe to run from many
        processes at once (advisory lock / write lock). On PostgreSQL it then
        drops, concurrently, an index a newer version replaced (logging a
        warning first): that waits for the transactions open on the jobs
        table, including one this process holds on another connection.

        Migrating a schema in use locks the jobs table. On PostgreSQL a lock
        request waiting behind an open transaction holds every later
        enqueue and claim behind it, so each attempt waits at most a second
        for its locks; then it is rolled back, a warning names the session
        holding the lock (pid, application, state, how long its transaction
        has been open, its query), and it is tried again after a pause
        (1 s, doubling up to 10 s) in which the workers and producers go on.
        On SQLite a waiting writer holds no one up; after 2 s it warns that
        it waits (SQLite cannot say for whom).

        Args:
            lock_wait: seconds to keep trying for the locks in all, > 0
                (default 300); then ``DatabaseUnavailable`` is raised,
                naming the holder, with nothing changed. Waiting for
                another ``migrate`` to finish counts too.

        Returns:
            The schema version now applied: above ``backend.schema_expected()``
            when a newer jobkeeper migrated the database (nothing is applied
            then; ``jobkeeper migrate`` says so).

        Raises:
            ConfigError: ``lock_wait`` is not a finite number of seconds > 0.
            DatabaseUnavailable: the database cannot be reached, or the
                locks were not had within ``lock_wait``; nothing is applied.
            DatabaseError: jobkeeper's tables exist with no schema version
                recorded (``jobkeeper_schema`` emptied or dropped); nothing is
                applied.
        """
        wait = check_seconds("lock_wait", lock_wait, allow_zero=False)
        return self.backend.migrate(lock_wait=wait)

    # -- tasks -----------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        priority: int = 0,
        timeout: float | None = None,
        backoff: Callable[[int, BaseException], float] | None = None,
        max_crashes: int | None = None,
    ) -> _TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        priority: int = 0,
        timeout: float | None = None,
        backoff: Callable[[int, BaseException], float] | None = None,
        max_crashes: int | None = None,
    ) -> Any:
        """Register a function as a task: ``@jq.task`` or ``@jq.task(queue="emails", ...)``.

        Args:
            name: the name jobs refer to (default: the function's ``__name__``).
            queue: default queue for its jobs.
            max_attempts: attempts before a job goes to the dead letters (1..1,000,000).
            priority: default priority, a 32-bit int; lower runs first.
            timeout: seconds an attempt may run before it is asked to stop
                and fails with a timeout error under the retry policy, once
                its code has returned (the job stays held until then);
                ``None`` = no limit.
            backoff: the task's retry policy: a function ``(attempt, error)
                -> seconds`` called after a failed attempt (``attempt`` is
                the one that failed, from 1; ``error`` the exception it
                raised). Its result is capped at about 100 years; one that
                raises or returns no finite number >= 0 is logged and the
                exponential default used. ``Retry(delay=...)`` still wins.
                ``None`` (default): exponential with full jitter.
            max_crashes: the task's crash budget (1..1,000,000): pinned
                crashes (a lone attempt whose worker died under it) before
                its job goes to the dead letters; ``None`` (default): the
                queue's ``max_crashes``.

        Raises:
            ConfigError: an invalid option (a ``backoff`` that is not a
                function of two arguments), or a name already registered.
        """

        def register(function: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name if name is not None else getattr(function, "__name__", None)
            if task_name is None:
                raise ConfigError(f"cannot name task {function!r}: pass name=")
            if task_name in self.tasks:
                raise ConfigError(f"a task named {task_name!r} is already registered")
            task: Task[Any, Any] = Task(
                self,
                function,
                name=task_name,
                queue=queue,
                max_attempts=max_attempts,
                priority=priority,
                timeout=timeout,
                backoff=backoff,
                max_crashes=max_crashes,
            )
            self.tasks[task.name] = task
            return task

        if fn is not None:
            return register(fn)
        return register

    async def aclose(self) -> None:
        """Close what async calls hold on the running loop, then the rest
        (:meth:`close`).
        """
        if self._backend is not None:
            await self._backend.aclose()
        self.close()


def _name_as_job_queue(*mixins: type) -> None:
    """Name the mixins' public methods ``JobQueue.<name>``: Python's own
    errors for a bad call ("got an unexpected keyword argument") name a
    function by its qualified name, which otherwise names a mixin users
    never see.
    """
    for mixin in mixins:
        for name, member in vars(mixin).items():
            if not name.startswith("_") and inspect.isfunction(member):
                member.__qualname__ = f"JobQueue.{name}"


_name_as_job_queue(
    EnqueueMixin, ResultsMixin, OperationsMixin, FlowControlMixin, RunningMixin, PeriodicsMixin
)


def _open_tracing(tracing: Any) -> Tracing | None:
    """``JobQueue(tracing=...)``: None when off, else the spans' maker.

    Raises:
        ConfigError: not a bool or a tracer provider, or ``opentelemetry-api``
            is missing.
    """
    if tracing is False or tracing is None:
        return None
    if tracing is not True and not callable(getattr(tracing, "get_tracer", None)):
        raise ConfigError(
            f"tracing must be True, False or an OpenTelemetry TracerProvider, got {shown(tracing)}"
        )
    try:
        return Tracing(None if tracing is True else tracing)
    except ImportError as exc:
        raise ConfigError(
            f"tracing needs the OpenTelemetry API ({exc}): pip install 'jobkeeper[otel]'"
        ) from None
