"""Enqueueing, sync and async: every input validated before anything is committed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from jobkeeper.api.base import (
    _CALL_OPTIONS,
    _JOB_OPTIONS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    QueueBase,
    _given,
    _job_id,
)
from jobkeeper.backends import BACKENDS
from jobkeeper.config import (
    check_max_attempts,
    check_name,
    check_priority,
    check_schedule,
    check_unique_key,
)
from jobkeeper.connections import unwrap_connection, unwrap_connection_async
from jobkeeper.errors import ConfigError, PayloadError, shown
from jobkeeper.frozen import frozen_builder
from jobkeeper.models import Job, NewJob, NewJobStream, StreamReader
from jobkeeper.payload import encode_args, encode_checked
from jobkeeper.queues import check_serial_key
from jobkeeper.tasks import ENQUEUE_OPTIONS, Task, suggest

#: A NewJob of the task's defaults (the common case: no options), built
#: without the frozen ``__init__``'s keyword binding (see frozen_builder).
_plain_new_job = frozen_builder(
    NewJob, ("task", "args_json", "args", "queue", "priority", "max_attempts")
)


def _plain_job(
    task_name: str, args_json: str, args: dict[str, Any] | None, registered: Task[Any, Any] | None
) -> NewJob:
    """The checked job with no options: the task's defaults, or the global
    ones for a task not registered here.
    """
    if registered is None:
        return _plain_new_job(task_name, args_json, args, DEFAULT_QUEUE, 0, DEFAULT_MAX_ATTEMPTS)
    return _plain_new_job(
        task_name,
        args_json,
        args,
        registered.queue,
        registered.priority,
        registered.max_attempts,
    )


#: The ``args_json`` of a head that rows share (see NewJobStream): no
#: encoder writes it, so it is never a row's own.
_SHARED_HEAD = "(each row has its own args)"


def _with_args(head: NewJob, args_json: str, args: Any) -> NewJob:
    """The NewJob of a row whose head it shares: a task given without
    options (no other field but the task's defaults to carry over).
    """
    return _plain_new_job(head.task, args_json, args, head.queue, head.priority, head.max_attempts)


def _stream_reader(
    validate: Callable[[Any], NewJob],
    known: dict[str, tuple[str, Task[Any, Any] | None]],
    max_bytes: int,
) -> StreamReader:
    """The reader of an ``enqueue_many``'s :class:`NewJobStream`: each item
    checked by ``validate``, except the usual one, ``(task name, args)`` of
    a task met before in the batch (``known``), which is checked here as
    ``validate`` would check it and shares its task's head: a thousand
    NewJobs were a quarter of a bulk enqueue's client time, with the
    garbage collections their allocations set off.
    """
    # task name -> (the head its rows share, its Task, the args_json of {}
    # when {} is valid args for it, else None)
    shared: dict[str, tuple[NewJob, Task[Any, Any] | None, str | None]] = {}

    def share(name: str) -> None:
        task_name, registered = known[name]
        empty: str | None
        try:
            empty = encode_checked({}, "args", max_bytes)
            if registered is not None:
                registered.check_args({})
        except PayloadError:
            empty = None
        head = _plain_job(task_name, _SHARED_HEAD, None, registered)
        shared[name] = (head, registered, empty)

    def read(
        items: list[Any],
        start: int,
        stop: int,
        heads: list[NewJob],
        args_json: list[str],
        args_column: list[Any],
    ) -> None:
        index = start
        try:
            for index in range(start, stop):
                item = items[index]
                plain = (
                    type(item) is tuple
                    and len(item) == 2
                    and type(item[1]) is dict
                    and type(item[0]) is str
                )
                found = shared.get(item[0]) if plain else None
                if found is None:
                    new = validate(item)
                    heads.append(new)
                    args_json.append(new.args_json)
                    args_column.append(new.args)
                    if plain and item[0] in known:
                        share(item[0])
                    continue
                head, registered, empty = found
                args = item[1]
                if args or empty is None:
                    text = encode_checked(args, "args", max_bytes)
                    if registered is not None:
                        registered.check_args(args)
                else:
                    text = empty  # {} for a task that takes it: checked once, in share()
                heads.append(head)
                args_json.append(text)
                args_column.append(args)
        except (PayloadError, ConfigError) as exc:
            raise type(exc)(f"jobs[{index}]: {exc}") from None

    return read


def _named_options(items: list[Any]) -> set[str]:
    """Every option name the items' own options dicts give (malformed items
    are left to validation, which names them).
    """
    named: set[str] = set()
    for item in items:
        # The same tests validate() applies: a tuple subclass (a namedtuple)
        # is an item, and its options count.
        if isinstance(item, tuple) and len(item) == 3 and isinstance(item[2], dict):
            named.update(item[2])
    return named


class EnqueueMixin(QueueBase):
    """Enqueue methods of :class:`~jobkeeper.JobQueue`."""

    # -- enqueue -----------------------------------------------------------------

    def _new_job(
        self,
        task: Any,
        args: Any,
        options: dict[str, Any],
        known: dict[str, tuple[str, Task[Any, Any] | None]] | None = None,
    ) -> NewJob:
        """Validate one job completely, writing nothing. ``known``: task
        names already resolved in this batch (see :meth:`_task_of`).
        """
        external = False
        if options and "external" in options:
            options = dict(options)
            external = options.pop("external")
            if not isinstance(external, bool):
                raise ConfigError(f"external must be True or False, got {shown(external)}")
        unknown = sorted(options.keys() - _JOB_OPTIONS) if options else None
        if unknown:
            raise ConfigError(
                f"unknown enqueue option {unknown[0]!r}; valid options: "
                + ", ".join([*(o for o in ENQUEUE_OPTIONS if o != "connection"), "external"])
            )
        if known is not None and type(task) is str and not external:
            resolved = known.get(task)
            if resolved is None:
                resolved = known[task] = self._task_of(task, external=False)
            task_name, registered = resolved
        else:
            task_name, registered = self._task_of(task, external=external)
        if args is None:
            args = {}
        args_json = encode_args(args, max_bytes=self.settings.max_payload_bytes)
        if registered is not None:
            registered.check_args(args)
        if not options:
            return _plain_job(task_name, args_json, args, registered)
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

    def _task_of(self, task: Any, *, external: bool) -> tuple[str, Task[Any, Any] | None]:
        """The name of ``task`` and this queue's Task of that name (None: not
        registered here).

        Raises:
            ConfigError: an invalid name, or one that is neither registered
                nor external (see :meth:`_check_external`).
        """
        task_name = task.name if isinstance(task, Task) else check_name("task", task)
        registered = self.tasks.get(task_name)
        if registered is None and self.tasks and not external:
            self._check_external(task_name)
        return task_name, registered

    def _check_external(self, task_name: str) -> None:
        """Refuse a name that is neither registered nor declared external.

        Raises:
            ConfigError: naming the task and the closest registered name.
        """
        declared = self.external_tasks
        if declared is True or (declared is not False and task_name in declared):
            return
        raise ConfigError(
            f"unknown task {task_name!r}{suggest(task_name, self.tasks)}: no task of this "
            "JobQueue has that name; if another service runs it, pass external=True "
            "(or list it in JobQueue(external_tasks=[...]))"
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
        external: bool = False,
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
                (claimed or running) at once, on any worker, in any queue;
                among a key's due jobs in one queue, priority/scheduled_at/id
                order (across queues, whichever queue is claimed first). A
                job waiting out a retry does not hold its key.
            connection: a psycopg 3 ``Connection`` (PostgreSQL) or
                ``sqlite3.Connection`` to the same file, or a framework's
                connection around one: Django's ``django.db.connection``, a
                SQLAlchemy ``Connection`` or ``Session`` (see
                :func:`jobkeeper.connections.unwrap_connection`); the job
                commits or rolls back with that connection's transaction.
            external: the task is run by another service's workers: enqueue
                ``task`` even though this queue, which has tasks registered,
                registers none of that name (a queue with no tasks enqueues
                any name). Also an ``enqueue_many`` option.

        Returns:
            The stored :class:`Job` (or the pending duplicate for ``unique_key``).

        Raises:
            PayloadError: args not a JSON object of JSON-native values (NaN,
                Infinity, NUL, lone surrogates, non-str keys...), too large, or
                not matching a registered task's parameters. Names the field.
            ConfigError: an invalid name, option, delay, run_at or priority; a
                task name this queue does not register while it registers
                others (with the closest one), unless ``external``.
            TypeError: ``connection`` of the wrong kind or database.
            QueueFull: the queue is at its ``max_pending``; nothing written.
            DatabaseUnavailable: the database cannot be reached; nothing written.
        """
        new = self._new_job(task, args, _given(locals(), _CALL_OPTIONS))
        if self._tracing is None:
            return self.backend.job_insert_many(
                jobs=[new], connection=unwrap_connection(connection)
            )[0]
        with self._tracing.enqueue_span([new], batch=False) as span:
            job = self.backend.job_insert_many(
                jobs=span.jobs, connection=unwrap_connection(connection)
            )[0]
            span.stored([job])
        return job

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
                nothing is written. (PostgreSQL validates a large batch while
                it copies it in, in the transaction that a refused item
                rolls back; SQLite validates every item first.)
            QueueFull: the batch would take a queue past its ``max_pending``;
                nothing was written.
            DatabaseUnavailable: nothing was written.
        """
        new_jobs = self._new_jobs(jobs)
        if self._tracing is None or not new_jobs:
            return self.backend.job_insert_many(
                jobs=new_jobs, connection=unwrap_connection(connection)
            )
        with self._tracing.enqueue_span(new_jobs, batch=True) as span:
            return self.backend.job_insert_many(
                jobs=span.jobs, connection=unwrap_connection(connection)
            )

    def _new_jobs(self, jobs: Iterable[Any]) -> Sequence[NewJob]:
        """The jobs of an ``enqueue_many``, writing nothing: validated whole
        (a list), or, when the backend streams inserts and no span needs
        them first, as the backend reads them (:class:`NewJobStream`).
        """
        if isinstance(jobs, str | bytes | bytearray | Mapping) or not isinstance(jobs, Iterable):
            # A str, bytes or dict iterates, but into characters, ints or
            # keys, each then refused as "jobs[0]" for what it is not.
            raise ConfigError(
                "jobs must be a list (or other iterable) of (task, args) or "
                f"(task, args, options) tuples, got {type(jobs).__name__}"
            )
        known: dict[str, tuple[str, Task[Any, Any] | None]] = {}
        max_bytes = self.settings.max_payload_bytes

        def validate(item: Any) -> NewJob:
            if not isinstance(item, tuple) or len(item) not in (2, 3):
                got = (
                    f"a tuple of {len(item)} item{'' if len(item) == 1 else 's'}"
                    if isinstance(item, tuple)
                    else type(item).__name__
                )
                raise ConfigError(
                    f"each item must be a (task, args) or (task, args, options) tuple, got {got}"
                )
            options = item[2] if len(item) == 3 else {}
            if not isinstance(options, dict):
                raise ConfigError(f"options must be a dict, got {type(options).__name__}")
            if "connection" in options:
                raise ConfigError("pass connection= to enqueue_many itself, not per job")
            return self._new_job(item[0], item[1], options, known)

        items = list(jobs)
        reader = _stream_reader(validate, known, max_bytes)
        if self._tracing is None and BACKENDS[self.url.scheme].streams_inserts:
            keyed = not _named_options(items).isdisjoint(("unique_key", "serial_key"))
            return NewJobStream(items, reader, _with_args, keyed=keyed)
        # Read the same way, then made a NewJob per row: SQLite's insert and
        # the tracing span read them as such.
        stream = NewJobStream(items, reader, _with_args, keyed=False)
        stream.read()
        return list(stream)

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
        external: bool = False,
    ) -> Job:
        """:meth:`enqueue` for async code: the event loop never waits on the
        database (PostgreSQL: a psycopg async pool; SQLite: a small thread
        pool). Validated as :meth:`enqueue` validates, before any I/O.

        Args:
            connection: a psycopg 3 ``AsyncConnection`` to this database, or
                SQLAlchemy's ``AsyncConnection`` or ``AsyncSession`` on the
                psycopg driver (see
                :func:`jobkeeper.connections.unwrap_connection_async`): the
                job commits or rolls back with its transaction. (SQLite: a
                ``sqlite3.Connection``, written on the calling thread.)

        Raises:
            As :meth:`enqueue`.
        """
        new = self._new_job(task, args, _given(locals(), _CALL_OPTIONS))
        connection = await unwrap_connection_async(connection)
        if self._tracing is None:
            jobs = await self.backend.job_insert_many_async(jobs=[new], connection=connection)
            return jobs[0]
        with self._tracing.enqueue_span([new], batch=False) as span:
            jobs = await self.backend.job_insert_many_async(jobs=span.jobs, connection=connection)
            span.stored(jobs)
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
        connection = await unwrap_connection_async(connection)
        if self._tracing is None or not new_jobs:
            return await self.backend.job_insert_many_async(jobs=new_jobs, connection=connection)
        with self._tracing.enqueue_span(new_jobs, batch=True) as span:
            return await self.backend.job_insert_many_async(jobs=span.jobs, connection=connection)

    async def get_job_async(self, job_id: int) -> Job | None:
        """:meth:`get_job` for async code."""
        return await self.backend.job_get_async(job_id=_job_id(job_id))
