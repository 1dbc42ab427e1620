"""``JobQueue``: the facade users hold. Validates every input before anything
is written, then delegates to a backend (River's ``Client``, Oban's ``Oban``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from jobkeeper.backends import Backend, open_backend, resolve_database_url
from jobkeeper.config import (
    DEFAULT_MAX_CRASHES,
    MAX_CONCURRENCY,
    MAX_SETTING_SECONDS,
    Settings,
    check_max_attempts,
    check_name,
    check_priority,
    check_schedule,
    check_seconds,
    check_unique_key,
)
from jobkeeper.connections import unwrap_connection
from jobkeeper.errors import (
    ConfigError,
    DatabaseUnavailable,
    JobNotFound,
    JobStateError,
    PayloadError,
    UniqueKeyConflict,
)
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.maintenance.periodic import MAX_REFRESH
from jobkeeper.models import (
    TERMINAL_STATUSES,
    Job,
    JobStatus,
    NewJob,
    QueueCounts,
    WorkerInfo,
)
from jobkeeper.payload import encode_args
from jobkeeper.periodic import (
    DEFAULT_CATCH_UP,
    Periodic,
    PeriodicRegistry,
    PeriodicRow,
    unknown_option,
)
from jobkeeper.queues import (
    UNSET,
    QueueInfo,
    QueueSettings,
    Unset,
    check_concurrency,
    check_max_pending,
    check_serial_key,
    enforces_queue_settings,
    parse_queue_share,
    parse_rate_limit,
)
from jobkeeper.tasks import ENQUEUE_OPTIONS, Task
from jobkeeper.waiting import Get, Mark, Ready, Sleep, check_timeout, wait_plan

logger = logging.getLogger("jobkeeper")

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_QUEUE = "default"


class _TaskDecorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class _PeriodicDecorator(Protocol):
    def __call__(self, task: Task[P, R], /) -> Task[P, R]: ...


#: Options a job may carry (``connection`` belongs to the call, not the job).
_JOB_OPTIONS = frozenset(ENQUEUE_OPTIONS) - {"connection"}
RETRYABLE_FROM = frozenset(
    {JobStatus.DEAD, JobStatus.RETRYABLE, JobStatus.CANCELLED, JobStatus.COMPLETED}
)
DEFAULT_MAX_ATTEMPTS = 20


class JobQueue:
    """A durable job queue on one database.

    Creating one connects to nothing; the first call that needs the database
    does. Thread-safe: API calls may come from any thread (on PostgreSQL they
    share a small connection pool).

    Args:
        database_url: ``sqlite:///path.db`` or ``postgresql://user@host:port/db``;
            default: ``$JOBKEEPER_DATABASE_URL``, else ``sqlite:///jobkeeper.db``.
        heartbeat_interval: seconds between worker heartbeats (default 5).
        rescue_after: seconds without a heartbeat before a running job is
            rescued (default 60; at least 3 x ``heartbeat_interval``).
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

    Raises:
        ConfigError: an invalid URL or setting (nothing is connected).
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
        )
        self.tasks: dict[str, Task[Any, Any]] = {}
        #: The periodic jobs registered with :meth:`periodic`, by name.
        self.periodics = self._new_periodic_registry()
        #: Listeners of this queue's job events (see :meth:`on_event`).
        self.events = EventBus()
        self._backend: Backend | None = None
        self._backend_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JobQueue {self.url.redacted()} tasks={sorted(self.tasks)}>"

    @property
    def backend(self) -> Backend:
        """The backend (created on first use)."""
        if self._backend is None:
            with self._backend_lock:
                if self._backend is None:
                    self._backend = open_backend(self.url, self.settings)
        return self._backend

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
        other.periodics = self.periodics
        other.events = self.events
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

    def close(self) -> None:
        """Close the queue's connections (it reconnects if used again)."""
        with self._backend_lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None

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

    def migrate(self) -> int:
        """Create or upgrade the schema; idempotent and safe to run from many
        processes at once (advisory lock / write lock).

        Returns:
            The schema version now applied.

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        return self.backend.migrate()

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

    # -- periodic jobs -----------------------------------------------------------

    def _new_periodic_registry(self) -> PeriodicRegistry:
        return PeriodicRegistry(
            self.tasks,
            max_payload_bytes=lambda: self.settings.max_payload_bytes,
            defaults=(DEFAULT_QUEUE, 0, DEFAULT_MAX_ATTEMPTS),
        )

    @overload
    def periodic(
        self,
        cron: str | None = None,
        *,
        every: float | None = None,
        timezone: str = "UTC",
        task: None = None,
        args: dict[str, Any] | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        catch_up: float = DEFAULT_CATCH_UP,
        **unknown: Any,
    ) -> _PeriodicDecorator: ...

    @overload
    def periodic(
        self,
        cron: str | None = None,
        *,
        every: float | None = None,
        timezone: str = "UTC",
        task: str | Task[Any, Any],
        args: dict[str, Any] | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        catch_up: float = DEFAULT_CATCH_UP,
        **unknown: Any,
    ) -> Periodic: ...

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: float | None = None,
        timezone: str = "UTC",
        task: str | Task[Any, Any] | None = None,
        args: dict[str, Any] | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        catch_up: float = DEFAULT_CATCH_UP,
        **unknown: Any,
    ) -> Any:
        """Run a task on a schedule: ``@jq.periodic("0 3 * * *")`` above
        ``@jq.task()``, or ``jq.periodic("*/15 * * * *", task="cleanup")``, or
        ``jq.periodic(every=30, task="poll_feeds")``.

        Every running worker of this app takes part; each tick is enqueued
        once across the fleet, with ``scheduled_at`` = the tick (see
        :mod:`jobkeeper.maintenance.periodic`).

        Args:
            cron: five cron fields or an ``@alias``, read in ``timezone``
                (see :class:`~jobkeeper.Schedule` for the daylight-saving rules).
            every: instead of ``cron``: an interval in whole seconds, ticks
                aligned to the Unix epoch.
            timezone: IANA name for ``cron`` (default ``"UTC"``).
            task: the call form: a Task or a task name (it need not be
                registered here; its args are then checked as JSON only).
            args: the jobs' keyword arguments, checked as an enqueue checks them.
            name: unique per queue and per database (default: the task's
                name); the stored record of the periodic's ticks is keyed on it.
            queue, priority, max_attempts: of the jobs (default: the task's).
            catch_up: seconds (default 60): a tick missed while no worker ran
                is enqueued on return when it is at most this old, else
                skipped and logged; 0 skips every missed tick. Ticks that came
                due while a worker ran are never missed.

        Returns:
            The decorator form returns a decorator that returns the Task; the
            call form returns the :class:`~jobkeeper.periodic.Periodic`.

        Raises:
            ConfigError: naming the input: an invalid expression, time zone,
                interval, option or name; an unknown option; args that are not
                a JSON object of JSON-native values or do not match the task;
                a second periodic with the same name; the decorator on
                something other than a Task (put it above ``@jq.task()``).
        """
        if unknown:
            raise unknown_option(unknown)

        def register(target: str | Task[Any, Any]) -> Periodic:
            return self.periodics.register(
                target,
                cron=cron,
                every=every,
                timezone=timezone,
                args=args,
                name=name,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                catch_up=catch_up,
            )

        if task is not None:
            if not isinstance(task, str | Task):
                raise ConfigError(f"periodic task= must be a Task or a task name, got {task!r}")
            return register(task)

        def decorate(target: Task[P, R]) -> Task[P, R]:
            if not isinstance(target, Task):
                raise ConfigError(
                    f"@jq.periodic needs a task, got {target!r}: put it above @jq.task()"
                )
            register(target)
            return target

        return decorate

    def periodic_list(self, *, stale_after: float | None = None) -> list[PeriodicRow]:
        """The stored periodic jobs (every app's, not only this one's), by name.

        Args:
            stale_after: seconds without a pass of a worker registering a
                periodic after which it is ``stale`` (default: ``rescue_after``,
                at least three of the workers' longest refresh periods, 15 s):
                no running worker registers it any more.
        """
        return self.backend.periodic_list(stale_after=self._stale_after(stale_after))

    def periodic_prune(self, *, stale_after: float | None = None) -> list[str]:
        """Delete the stale periodic rows (see :meth:`periodic_list`); return
        their names. A periodic pruned while its workers are all down starts
        afresh when they return (no catch-up of the ticks missed meanwhile).
        """
        return self.backend.periodic_prune(stale_after=self._stale_after(stale_after))

    def _stale_after(self, stale_after: float | None) -> float:
        if stale_after is None:
            return max(self.settings.rescue_after, 3 * MAX_REFRESH)
        if (
            isinstance(stale_after, bool)
            or not isinstance(stale_after, int | float)
            or not math.isfinite(stale_after)
            or stale_after < 0
        ):
            raise ConfigError(f"stale_after must be a number of seconds >= 0, got {stale_after!r}")
        return float(stale_after)

    # -- enqueue -----------------------------------------------------------------

    def _new_job(self, task: Any, args: Any, options: dict[str, Any]) -> NewJob:
        """Validate one job completely, writing nothing."""
        unknown = sorted(options.keys() - _JOB_OPTIONS) if options else None
        if unknown:
            raise ConfigError(
                f"unknown enqueue option {unknown[0]!r}; valid options: "
                + ", ".join(o for o in ENQUEUE_OPTIONS if o != "connection")
            )
        task_name = task.name if isinstance(task, Task) else check_name("task", task)
        registered = self.tasks.get(task_name)
        if args is None:
            args = {}
        args_json = encode_args(args, max_bytes=self.settings.max_payload_bytes)
        if registered is not None:
            registered.check_args(args)
        if not options:
            # The common bulk case: the task's (or the global) defaults.
            return NewJob(
                task=task_name,
                args_json=args_json,
                args=args,
                queue=registered.queue if registered else DEFAULT_QUEUE,
                priority=registered.priority if registered else 0,
                max_attempts=registered.max_attempts if registered else DEFAULT_MAX_ATTEMPTS,
            )
        queue = options.get("queue")
        priority = options.get("priority")
        max_attempts = options.get("max_attempts")
        delay, run_at = check_schedule(options.get("delay"), options.get("run_at"))
        return NewJob(
            task=task_name,
            args_json=args_json,
            args=args,
            queue=check_name("queue", queue)
            if queue is not None
            else (registered.queue if registered else DEFAULT_QUEUE),
            priority=check_priority(priority)
            if priority is not None
            else (registered.priority if registered else 0),
            max_attempts=check_max_attempts(max_attempts)
            if max_attempts is not None
            else (registered.max_attempts if registered else DEFAULT_MAX_ATTEMPTS),
            delay=delay,
            run_at=run_at,
            unique_key=check_unique_key(options.get("unique_key")),
            serial_key=check_serial_key(options.get("serial_key")),
        )

    def enqueue(
        self,
        task: str | Task[Any, Any],
        args: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        serial_key: str | None = None,
        connection: Any = None,
    ) -> Job:
        """Store one job; returns once it is durable (committed), or, with
        ``connection``, once it is written in the caller's open transaction.

        Args:
            task: a task name (need not be registered in this process) or Task.
            args: the task's keyword arguments: a JSON object of JSON-native
                values, at most ``max_payload_bytes`` encoded.
            queue: queue name (default: the task's, else ``"default"``).
            run_at: an aware datetime; not run before it. Naive datetimes are refused.
            delay: seconds from now (database clock); not with ``run_at``.
            priority: 32-bit int, lower runs first (default: the task's, else 0).
            max_attempts: 1..1,000,000 (default: the task's, else 20).
            unique_key: while a job of the same task with this key is pending
                (scheduled/available/claimed/running/retryable), return that job
                instead of inserting a new one.
            serial_key: jobs with the same serial_key are never held
                (claimed or running) at once, on any worker; among a key's
                due jobs, priority/scheduled_at/id order. A job waiting out a
                retry does not hold its key.
            connection: a psycopg 3 ``Connection`` (PostgreSQL) or
                ``sqlite3.Connection`` to the same file, or a framework's
                connection around one: Django's ``django.db.connection``, a
                SQLAlchemy ``Connection`` or ``Session`` (see
                :func:`jobkeeper.connections.unwrap_connection`); the job
                commits or rolls back with that connection's transaction.

        Returns:
            The stored :class:`Job` (or the pending duplicate for ``unique_key``).

        Raises:
            PayloadError: args not a JSON object of JSON-native values (NaN,
                Infinity, NUL, lone surrogates, non-str keys...), too large, or
                not matching a registered task's parameters. Names the field.
            ConfigError: an invalid name, option, delay, run_at or priority.
            TypeError: ``connection`` of the wrong kind or database.
            QueueFull: the queue is at its ``max_pending``; nothing written.
            DatabaseUnavailable: the database cannot be reached; nothing written.
        """
        new = self._new_job(task, args, _given(locals(), _JOB_OPTIONS))
        return self.backend.job_insert_many(jobs=[new], connection=unwrap_connection(connection))[0]

    def enqueue_many(
        self,
        jobs: Iterable[
            tuple[str | Task[Any, Any], dict[str, Any]]
            | tuple[str | Task[Any, Any], dict[str, Any], dict[str, Any]]
        ],
        *,
        connection: Any = None,
    ) -> list[Job]:
        """Store many jobs in one transaction and one round trip, all or nothing.

        Args:
            jobs: ``(task, args)`` or ``(task, args, options)`` tuples; options
                take the keywords of :meth:`enqueue` (except ``connection``).
            connection: as for :meth:`enqueue`.

        Returns:
            One Job per input, in input order.

        Raises:
            PayloadError, ConfigError: naming the item (``jobs[3]: args.x: ...``);
                every item is validated before anything is written.
            QueueFull: the batch would take a queue past its ``max_pending``;
                nothing was written.
            DatabaseUnavailable: nothing was written.
        """
        new_jobs = self._new_jobs(jobs)  # validated before the backend is opened
        return self.backend.job_insert_many(jobs=new_jobs, connection=unwrap_connection(connection))

    def _new_jobs(self, jobs: Iterable[Any]) -> list[NewJob]:
        """Validate every item of an ``enqueue_many``, writing nothing."""
        new_jobs: list[NewJob] = []
        for index, item in enumerate(jobs):
            try:
                if not isinstance(item, tuple) or len(item) not in (2, 3):
                    raise ConfigError(
                        "each item must be a (task, args) or (task, args, options) tuple, "
                        f"got {type(item).__name__}"
                    )
                options = item[2] if len(item) == 3 else {}
                if not isinstance(options, dict):
                    raise ConfigError(f"options must be a dict, got {type(options).__name__}")
                if "connection" in options:
                    raise ConfigError("pass connection= to enqueue_many itself, not per job")
                new_jobs.append(self._new_job(item[0], item[1], options))
            except (PayloadError, ConfigError) as exc:
                raise type(exc)(f"jobs[{index}]: {exc}") from None
        return new_jobs

    # -- async producers -------------------------------------------------------------

    async def enqueue_async(
        self,
        task: str | Task[Any, Any],
        args: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        serial_key: str | None = None,
        connection: Any = None,
    ) -> Job:
        """:meth:`enqueue` for async code: the event loop never waits on the
        database (PostgreSQL: a psycopg async pool; SQLite: a small thread
        pool). Validated as :meth:`enqueue` validates, before any I/O.

        Args:
            connection: a psycopg 3 ``AsyncConnection`` to this database: the
                job commits or rolls back with its transaction. (SQLite: a
                ``sqlite3.Connection``, written on the calling thread.)

        Raises:
            As :meth:`enqueue`.
        """
        new = self._new_job(task, args, _given(locals(), _JOB_OPTIONS))
        jobs = await self.backend.job_insert_many_async(jobs=[new], connection=connection)
        return jobs[0]

    async def enqueue_many_async(
        self,
        jobs: Iterable[
            tuple[str | Task[Any, Any], dict[str, Any]]
            | tuple[str | Task[Any, Any], dict[str, Any], dict[str, Any]]
        ],
        *,
        connection: Any = None,
    ) -> list[Job]:
        """:meth:`enqueue_many` for async code (see :meth:`enqueue_async`)."""
        new_jobs = self._new_jobs(jobs)
        return await self.backend.job_insert_many_async(jobs=new_jobs, connection=connection)

    async def get_job_async(self, job_id: int) -> Job | None:
        """:meth:`get_job` for async code."""
        return await self.backend.job_get_async(job_id=_job_id(job_id))

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
            ConfigError: a bad id or timeout.
        """
        job_id = _job_id(job_id)
        seconds = check_timeout(timeout)
        return _drive_wait(self.backend, job_id, seconds, self.settings.poll_interval)

    async def wait_async(self, job_id: int, timeout: float | None = None) -> Any:
        """:meth:`wait` for async code; many may wait at once on one loop."""
        job_id = _job_id(job_id)
        seconds = check_timeout(timeout)
        return await _drive_wait_async(self.backend, job_id, seconds, self.settings.poll_interval)

    async def aclose(self) -> None:
        """Close what async calls hold on the running loop, then the rest
        (:meth:`close`).
        """
        if self._backend is not None:
            await self._backend.aclose()
        self.close()

    # -- inspect and act -------------------------------------------------------------

    def get_job(self, job_id: int) -> Job | None:
        """The job with ``job_id``, live, dead or recently completed; ``None`` if
        unknown (or pruned).
        """
        return self.backend.job_get(job_id=_job_id(job_id))

    def list_jobs(
        self,
        status: JobStatus | str | None = None,
        queue: str | None = None,
        limit: int = 100,
        *,
        task: str | None = None,
        before: int | None = None,
    ) -> list[Job]:
        """Jobs newest first, filtered by ``status`` (``"dead"`` lists the dead
        letters), ``queue`` and ``task``; at most ``limit`` (1..10,000).

        Pages by keyset: pass the smallest id of one page as ``before`` to get
        the next (``WHERE id < before ORDER BY id DESC``), so a deep page costs
        what the first does.

        Raises:
            ConfigError: an unknown status, a bad limit, name or ``before``.
        """
        if status is not None:
            try:
                status = JobStatus(status)
            except ValueError:
                valid = ", ".join(s.value for s in JobStatus)
                raise ConfigError(f"unknown status {status!r}; valid: {valid}") from None
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ConfigError(f"limit must be an int between 1 and 10000, got {limit!r}")
        if queue is not None:
            check_name("queue", queue)
        if task is not None:
            check_name("task", task)
        if before is not None:
            before = _job_id(before)
        return self.backend.job_list(
            status=status, queue=queue, limit=limit, task=task, before=before
        )

    def cancel(self, job_id: int) -> Job:
        """Cancel a job. Pending jobs become ``cancelled`` at once; a held
        (claimed or running) job's worker is asked to stop it (it ends
        ``cancelled`` within about one ``heartbeat_interval``, or, if its code
        cannot be interrupted, once that code returns: the job stays held until
        then). From then on the job ends ``cancelled`` whatever its attempt
        does next (fails, retries, times out, is handed back or rescued),
        unless the attempt succeeds first: then it stays ``completed``.

        Returns:
            The job after the request.

        Raises:
            JobNotFound: no such job.
            JobStateError: the job already finished (completed, cancelled or dead).
        """
        job = self.backend.job_cancel(job_id=_job_id(job_id))
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        if job.status in TERMINAL_STATUSES and job.status != JobStatus.CANCELLED:
            raise JobStateError(f"job {job_id} is {job.status.value}; it cannot be cancelled")
        return job

    def retry(self, job_id: int) -> Job:
        """Run a dead, retryable, cancelled or completed job again now, with its
        attempts reset (errors are kept). Dead jobs move back from the dead letters.

        Raises:
            JobNotFound: no such job.
            JobStateError: the job is pending or running, or a pending job of
                the same task holds its ``unique_key``.
        """
        before = self.backend.job_get(job_id=_job_id(job_id))
        if before is None:
            raise JobNotFound(f"no job with id {job_id}")
        if before.status not in RETRYABLE_FROM:
            raise JobStateError(
                f"job {job_id} is {before.status.value}; only dead, retryable, cancelled or "
                "completed jobs can be retried"
            )
        try:
            job = self.backend.job_retry(job_id=job_id)
        except UniqueKeyConflict:
            if before.status == JobStatus.DEAD:
                raise self._requeue_refused([job_id]) from None
            raise JobStateError(
                f"job {job_id} cannot be retried: a pending job of the same task "
                "already holds its unique_key"
            ) from None
        if job is None:
            raise JobNotFound(f"job {job_id} was pruned before it could be retried")
        return job

    def requeue_dead(self, job_ids: Sequence[int] | None = None) -> list[int]:
        """Move dead letters back to the queue (all of them when ``job_ids`` is
        None), attempts reset. Returns the ids moved.

        Raises:
            JobStateError: a pending job of the same task holds one's ``unique_key``;
                nothing was moved.
        """
        ids = None if job_ids is None else [_job_id(i) for i in job_ids]
        try:
            return self.backend.dead_letter_requeue(job_ids=ids)
        except UniqueKeyConflict:
            raise self._requeue_refused(ids) from None

    def _requeue_refused(self, job_ids: Sequence[int] | None) -> JobStateError:
        """The error for a requeue refused by the unique index, naming the
        dead letters in the way and what holds their keys.
        """
        seen: dict[tuple[str, str], int] = {}
        clashes: list[str] = []
        for conflict in self.backend.dead_letter_requeue_conflicts(job_ids=job_ids):
            key = (conflict.task, conflict.unique_key)
            what = f"dead letter {conflict.dead_letter_id} (task {key[0]!r}, unique_key {key[1]!r})"
            if conflict.holder is not None:
                clashes.append(f"{what} is held by pending job {conflict.holder}")
            elif key in seen:
                clashes.append(f"{what} clashes with dead letter {seen[key]}")
            seen.setdefault(key, conflict.dead_letter_id)
        shown = "; ".join(clashes[:3]) or "a pending job of the same task holds a unique_key"
        more = f" (and {len(clashes) - 3} more)" if len(clashes) > 3 else ""
        return JobStateError(f"cannot requeue: {shown}{more}; nothing was requeued")

    def purge_dead(
        self, job_ids: Sequence[int] | None = None, *, older_than: float | None = None
    ) -> list[int]:
        """Delete dead letters for good: those of ``job_ids`` (all of them when
        None) that died more than ``older_than`` seconds ago (any age when
        None). Returns the ids deleted; ids that are not dead letters are
        ignored.

        Raises:
            ConfigError: a bad id or a negative ``older_than``.
        """
        ids = None if job_ids is None else [_job_id(i) for i in job_ids]
        if older_than is not None:
            check_seconds("older_than", older_than, allow_zero=True)
            if older_than > MAX_SETTING_SECONDS:
                raise ConfigError(f"older_than={older_than!r} is longer than 100 years")
        return self.backend.dead_letter_purge(job_ids=ids, older_than=older_than)

    def stats(self) -> dict[str, dict[str, int]]:
        """``{queue: {status: count}}`` with every status (zeros included), dead
        letters counted as ``"dead"``.
        """
        counts = self.backend.queue_stats()
        return {
            queue: {status.value: per_status.get(status.value, 0) for status in JobStatus}
            for queue, per_status in sorted(counts.items())
        }

    def workers(self) -> list[WorkerInfo]:
        """Registered workers and their last heartbeat."""
        return self.backend.worker_list()

    def queue_counts(self, exact_below: int = 100_000) -> QueueCounts:
        """Jobs per queue and status (dead letters as ``"dead"``), cheap at any
        table size: what the dashboard and ``/metrics`` show.

        Live statuses (scheduled, available, running, retryable) are always
        exact, read from their partial indexes. ``completed`` and
        ``cancelled`` are exact while the two together hold at most
        ``exact_below`` rows, and ``dead`` while the dead letters do; above
        that they are estimates (PostgreSQL: the planner's row estimate;
        SQLite: the rate of the newest rows extrapolated over the oldest's
        age) split across queues like the newest ``exact_below + 1`` rows,
        and named in ``QueueCounts.estimated``. Unlike :meth:`stats`, no
        count reads more than ``exact_below + 1`` finished rows or dead
        letters, so its cost stays flat however many ``retention`` keeps.
        """
        if isinstance(exact_below, bool) or not isinstance(exact_below, int) or exact_below < 1:
            raise ConfigError(f"exact_below must be a positive int, got {exact_below!r}")
        return self.backend.queue_counts(exact_below=exact_below)

    def oldest_due(self) -> dict[str, tuple[int, float]]:
        """Per queue with work due, its oldest job that could run now
        (available, or scheduled/retryable and past due): ``{queue: (job id,
        seconds since it became due)}``. The queue's latency.
        """
        return self.backend.queue_oldest_due()

    def throughput(
        self, since: float = 3600.0, bucket: float = 60.0
    ) -> list[tuple[datetime, dict[str, int]]]:
        """Jobs finished (``completed``, ``cancelled``) per ``bucket`` seconds
        over the last ``since`` seconds, oldest bucket first, empty buckets
        included: ``[(bucket start (UTC), {status: count})]``. Reads the
        finished index, so it costs what the window holds. Jobs already
        pruned (``retention``) are not counted.

        Raises:
            ConfigError: ``since`` or ``bucket`` not positive, or over 10,000 buckets.
        """
        check_seconds("since", since, allow_zero=False)
        check_seconds("bucket", bucket, allow_zero=False)
        if since / bucket > 10_000:
            raise ConfigError(f"since/bucket gives {since / bucket:.0f} buckets; at most 10000")
        rows = self.backend.job_throughput(since_seconds=since, bucket_seconds=bucket)
        now = self.backend.db_now().timestamp()
        last = math.floor(now / bucket) * bucket
        first = math.floor((now - since) / bucket) * bucket + bucket
        starts = [first + i * bucket for i in range(round((last - first) / bucket) + 1)]
        # Buckets are keyed by start; floats from the database may differ in
        # the last bits, so they are matched by their bucket number.
        by_number = {round(start / bucket): counts for start, counts in rows.items()}
        return [
            (datetime.fromtimestamp(start, UTC), by_number.get(round(start / bucket), {}))
            for start in starts
        ]

    def health(self) -> dict[str, Any]:
        """Facts about the database that ``jobkeeper doctor`` judges (see
        :meth:`jobkeeper.backends.base.Backend.database_health`).

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        return self.backend.database_health()

    # -- flow control -------------------------------------------------------------

    def pause(self, queue: str) -> QueueInfo:
        """Stop every worker from starting jobs of ``queue`` (running jobs
        finish). Persistent: it holds through restarts until :meth:`resume`.
        Warns (``UserWarning``) while a registered worker runs a jobkeeper too
        old to obey it.

        Raises:
            ConfigError: a bad queue name.
        """
        return self._configure(queue, {"paused": True})

    def resume(self, queue: str) -> QueueInfo:
        """Let workers start jobs of ``queue`` again (see :meth:`pause`).

        Raises:
            ConfigError: a bad queue name.
        """
        return self._configure(queue, {"paused": False})

    def configure_queue(
        self,
        queue: str,
        *,
        concurrency: int | Unset | None = UNSET,
        rate_limit: str | Unset | None = UNSET,
        max_pending: int | Unset | None = UNSET,
    ) -> QueueInfo:
        """Set flow-control limits of ``queue``, held by the database for all
        workers together; only the settings given change, and ``None`` lifts
        one. Warns (``UserWarning``) while a registered worker runs a
        jobkeeper too old to obey them.

        Args:
            queue: the queue's name.
            concurrency: most jobs of the queue held (claimed or running) at
                once across all workers (>= 1; pause to stop a queue).
            rate_limit: most starts per period across all workers, as
                ``"N/s"``, ``"N/m"`` or ``"N/h"``, in every sliding window.
            max_pending: most scheduled, available, claimed and retryable
                jobs; an enqueue past it raises :class:`~jobkeeper.QueueFull`.

        Returns:
            The queue as :meth:`queues` reports it.

        Raises:
            ConfigError: a bad name or value (nothing is changed).
        """
        changes: dict[str, Any] = {}
        if not isinstance(concurrency, Unset):
            changes["concurrency"] = None if concurrency is None else check_concurrency(concurrency)
        if not isinstance(rate_limit, Unset):
            changes["rate_limit"] = None if rate_limit is None else parse_rate_limit(rate_limit)
        if not isinstance(max_pending, Unset):
            changes["max_pending"] = None if max_pending is None else check_max_pending(max_pending)
        return self._configure(queue, changes)

    def _configure(self, queue: str, changes: dict[str, Any]) -> QueueInfo:
        check_name("queue", queue)
        if changes:
            settings = self.backend.queue_configure(name=queue, changes=changes)
            if settings.limits_claims or settings.max_pending is not None:
                self._warn_old_workers(queue)
        else:
            found = self.backend.queue_settings_list(names=[queue])
            settings = found[0] if found else QueueSettings(queue)
        counts = self.stats().get(queue) or {status.value: 0 for status in JobStatus}
        return _queue_info(settings, counts)

    def _warn_old_workers(self, queue: str) -> None:
        """Warn when a registered worker cannot obey queue settings."""
        old = [w for w in self.backend.worker_list() if not enforces_queue_settings(w.version)]
        if not old:
            return
        shown = ", ".join(f"{w.id} ({w.version or 'no version'})" for w in old[:3])
        more = f" and {len(old) - 3} more" if len(old) > 3 else ""
        message = (
            f"queue {queue!r}: {len(old)} registered worker(s) run a jobkeeper older than "
            f"flow control and will ignore its settings: {shown}{more}"
        )
        logger.warning("%s", message)
        warnings.warn(message, UserWarning, stacklevel=3)

    def queues(self) -> list[QueueInfo]:
        """Every queue that has jobs (live or dead) or settings, by name, with
        its settings and its jobs per status.
        """
        stored = {s.name: s for s in self.backend.queue_settings_list()}
        counts = self.stats()
        zero = {status.value: 0 for status in JobStatus}
        return [
            _queue_info(stored.get(name, QueueSettings(name)), counts.get(name, zero))
            for name in sorted(stored.keys() | counts.keys())
        ]

    # -- run -----------------------------------------------------------------

    def worker(
        self,
        queues: Sequence[str] | Mapping[str, int | None] | None = None,
        concurrency: int = 10,
        burst: bool = False,
        prefetch: int | None = None,
    ) -> Any:
        """A :class:`jobkeeper.worker.runner.Worker` for these queues, not started
        (``run_worker`` runs one). Validates like ``run_worker``.
        """
        from jobkeeper.worker.runner import Worker

        queue_names, shares = _queue_shares(queues)
        if not queue_names:
            queue_names = self.default_queues()
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise ConfigError(f"concurrency must be an int, got {concurrency!r}")
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ConfigError(
                f"concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}"
            )
        extra: dict[str, Any] = {}
        if shares:
            for name, share in shares.items():
                if share > concurrency:
                    raise ConfigError(
                        f"queue {name!r}: its share {share} is more than the worker's "
                        f"concurrency {concurrency}"
                    )
            # The producer's hook: Worker(queue_shares={queue: most running}).
            if "queue_shares" not in inspect.signature(Worker).parameters:
                raise ConfigError(
                    "per-queue shares (queue=N) are not supported by this worker yet; "
                    "name the queues without =N"
                )
            extra["queue_shares"] = shares
        return Worker(
            self.backend,
            self.tasks,
            self.settings,
            queues=queue_names,
            concurrency=concurrency,
            burst=burst,
            prefetch=prefetch,
            periodics=list(self.periodics.values()),
            events=self.events,
            **extra,
        )

    def default_queues(self) -> list[str]:
        """The queues a worker serves when none are named: every queue the
        registered tasks use, else ``["default"]``.
        """
        return sorted({task.queue for task in self.tasks.values()}) or [DEFAULT_QUEUE]

    def run_worker(
        self,
        queues: Sequence[str] | Mapping[str, int | None] | None = None,
        concurrency: int = 10,
        burst: bool = False,
        prefetch: int | None = None,
    ) -> int:
        """Run a worker in this thread until SIGTERM/SIGINT (or, with ``burst``,
        until nothing is available or due within ``poll_interval``).

        Args:
            queues: queue names to work (default: :meth:`default_queues`), or
                ``{queue: share}``: this worker runs at most ``share`` jobs of
                that queue at once, within ``concurrency`` (``None``: no
                share), so one slow queue cannot take every slot. A name may
                also be written ``"emails=5"``.
            concurrency: most jobs running at once (1..10,000).
            burst: drain and return.
            prefetch: jobs to claim beyond the free slots (0..10,000); ``None`` (default)
                adapts it to how long jobs take against how long a claim takes
                (none for jobs slower than a claim, up to ``concurrency``).

        Returns:
            0 after a clean stop; 1 if some outcomes could not be written
            (those jobs will be rescued and re-run).

        Raises:
            ConfigError: a bad queue name, concurrency or prefetch.
            DatabaseUnavailable: the database cannot be reached at start.
        """
        stats = self.worker(queues, concurrency, burst, prefetch).run()
        return int(stats.exit_code)


def _job_id(job_id: Any) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id < 2**63:
        raise ConfigError(f"job id must be a positive 64-bit int, got {job_id!r}")
    return job_id


def _given(values: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """The enqueue options among ``values`` (a call's ``locals()``) that were given."""
    return {name: values[name] for name in sorted(names) if values.get(name) is not None}


def _queue_shares(
    queues: Sequence[str] | Mapping[str, int | None] | None,
) -> tuple[list[str], dict[str, int]]:
    """Queue names in order and the per-queue shares among them, from a list
    (``"emails=5"`` allowed) or a ``{queue: share}`` mapping.

    Raises:
        ConfigError: a bad name or share, or a queue named twice with shares.
    """
    if not queues:
        return [], {}
    if isinstance(queues, str):
        raise ConfigError(f"queues must be a list of names or a mapping, got the string {queues!r}")
    items: list[tuple[str, int | None]] = []
    if isinstance(queues, Mapping):
        for name, share in queues.items():
            check_name("queue", name)
            if share is not None:
                if isinstance(share, bool) or not isinstance(share, int):
                    raise ConfigError(f"queue {name!r}: share must be an int >= 1, got {share!r}")
                parse_queue_share(f"{name}={share}")
            items.append((name, share))
    else:
        items = [parse_queue_share(text) for text in queues]
    names = list(dict.fromkeys(name for name, _ in items))
    shares: dict[str, int] = {}
    for name, share in items:
        if share is not None:
            if name in shares and shares[name] != share:
                raise ConfigError(f"queue {name!r} is given two shares: {shares[name]} and {share}")
            shares[name] = share
    return names, shares


def _queue_info(settings: QueueSettings, counts: dict[str, int]) -> QueueInfo:
    return QueueInfo(
        name=settings.name,
        paused=settings.paused,
        concurrency=settings.concurrency,
        rate_limit=settings.rate_text,
        max_pending=settings.max_pending,
        counts=dict(counts),
    )


def _drive_wait(backend: Backend, job_id: int, timeout: float | None, poll: float) -> Any:
    """Run the wait plan on this thread (see :mod:`jobkeeper.waiting`)."""
    watch = backend.completion_watch()
    woken = threading.Event()
    unregister = watch.register(job_id, woken.set)
    plan = wait_plan(job_id, timeout, poll)
    try:
        reply: Any = None
        error: DatabaseUnavailable | None = None
        while True:
            try:
                step = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as stop:
                return stop.value
            reply, error = None, None
            try:
                if isinstance(step, Ready):
                    reply = watch.wait_ready(step.seconds)
                elif isinstance(step, Mark):
                    backend.job_mark_awaited(job_id=job_id)
                elif isinstance(step, Get):
                    woken.clear()
                    reply = backend.job_get(job_id=job_id)
            except DatabaseUnavailable as exc:
                error = exc  # the plan waits it out until its timeout
                continue
            if isinstance(step, Sleep):
                woken.wait(step.seconds)
    finally:
        unregister()
        plan.close()


async def _drive_wait_async(
    backend: Backend, job_id: int, timeout: float | None, poll: float
) -> Any:
    """Run the wait plan on the event loop (see :mod:`jobkeeper.waiting`)."""
    loop = asyncio.get_running_loop()
    watch = backend.completion_watch()
    woken = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(woken.set)

    unregister = watch.register(job_id, wake)
    plan = wait_plan(job_id, timeout, poll)
    try:
        reply: Any = None
        error: DatabaseUnavailable | None = None
        while True:
            try:
                step = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as stop:
                return stop.value
            reply, error = None, None
            try:
                if isinstance(step, Ready):
                    reply = watch.ready or await asyncio.to_thread(watch.wait_ready, step.seconds)
                elif isinstance(step, Mark):
                    await backend.job_mark_awaited_async(job_id=job_id)
                elif isinstance(step, Get):
                    woken.clear()
                    reply = await backend.job_get_async(job_id=job_id)
            except DatabaseUnavailable as exc:
                error = exc  # the plan waits it out until its timeout
                continue
            if isinstance(step, Sleep):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), step.seconds)
    finally:
        unregister()
        plan.close()
