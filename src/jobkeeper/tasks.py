"""Tasks: functions registered with a JobQueue, and ``.options(...)`` overrides."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from jobkeeper.config import (
    check_max_attempts,
    check_max_crashes,
    check_name,
    check_priority,
    check_timeout,
)
from jobkeeper.errors import ConfigError, PayloadError
from jobkeeper.models import Job

P = ParamSpec("P")
R = TypeVar("R")

#: The options ``enqueue`` accepts, besides the args.
ENQUEUE_OPTIONS = (
    "queue",
    "delay",
    "run_at",
    "priority",
    "max_attempts",
    "unique_key",
    "serial_key",
    "connection",
)


class _Enqueuer(Protocol):
    @property
    def enqueue(self) -> Callable[..., Job]: ...

    @property
    def enqueue_async(self) -> Callable[..., Awaitable[Job]]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class TaskOptions:
    """Per-enqueue overrides, made by :meth:`Task.options`. Immutable; chain
    ``.options()`` calls to refine.
    """

    task: Task[Any, Any]
    overrides: dict[str, Any]

    def options(self, **overrides: Any) -> TaskOptions:
        """More overrides on top of these (same keywords as :meth:`Task.options`)."""
        _check_option_names(overrides)
        return TaskOptions(self.task, {**self.overrides, **overrides})

    def enqueue(self, **args: Any) -> Job:
        """Enqueue the task with keyword ``args`` and these options; see
        :meth:`jobkeeper.JobQueue.enqueue` for what is validated and raised.
        """
        return self.task.enqueue_with(args, self.overrides)

    async def enqueue_async(self, **args: Any) -> Job:
        """:meth:`enqueue` for async code (see :meth:`jobkeeper.JobQueue.enqueue_async`)."""
        return await self.task.enqueue_with_async(args, self.overrides)


def _check_option_names(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(ENQUEUE_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown enqueue option {unknown[0]!r}; valid options: {', '.join(ENQUEUE_OPTIONS)}"
        )


def suggest(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``candidates`` to ``name``,
    or ``""`` when none is close (difflib's ratio, cutoff 0.6).
    """
    close = difflib.get_close_matches(name, sorted(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Task(Generic[P, R]):
    """A function registered with ``@jq.task``.

    Calling the task runs the function directly, in-process; ``enqueue``
    stores a job for a worker to run.

    Attributes:
        name: the registered name jobs refer to.
        fn: the wrapped function (sync or ``async def``).
        queue: default queue.
        max_attempts: default attempt limit.
        priority: default priority (lower runs first).
        timeout: seconds an attempt may run before it is asked to stop; it
            fails with a timeout once its code has returned. ``None``: no limit.
        backoff: the task's retry policy, ``(attempt, error) -> seconds``,
            or ``None`` for the queue's exponential backoff.
        max_crashes: the task's crash budget (pinned crashes before its job
            goes to the dead letters), or ``None`` for the queue's setting.
        is_async: whether ``fn`` is a coroutine function.
    """

    def __init__(
        self,
        owner: _Enqueuer,
        fn: Callable[P, R],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        priority: int,
        timeout: float | None,
        backoff: Callable[[int, BaseException], float] | None = None,
        max_crashes: int | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"@task needs a function, got {fn!r}")
        self._owner = owner
        self.fn = fn
        self.name = check_name("task", name)
        self.queue = check_name("queue", queue)
        self.max_attempts = check_max_attempts(max_attempts)
        self.priority = check_priority(priority)
        self.timeout = check_timeout(timeout)
        self.backoff = check_backoff(backoff)
        self.max_crashes = None if max_crashes is None else check_max_crashes(max_crashes)
        self.is_async = inspect.iscoroutinefunction(fn)
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None
        # Keyword names the function accepts (None: it takes **kwargs) and
        # requires: set checks are all an enqueue needs in the common case.
        self._allowed: frozenset[str] | None = None
        self._required: frozenset[str] = frozenset()
        if self._signature is not None:
            params = self._signature.parameters.values()
            _refuse_positional_only(self.name, fn, params)
            keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
                self._allowed = frozenset(p.name for p in params if p.kind in keyword)
            self._required = frozenset(
                p.name
                for p in params
                if p.default is p.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            )
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"

    def check_args(self, args: dict[str, Any]) -> None:
        """Check ``args`` bind to the function's keyword parameters.

        Raises:
            PayloadError: a missing or unexpected keyword argument, named.
        """
        if self._signature is None:
            return
        keys = args.keys()
        if self._required <= keys and (self._allowed is None or keys <= self._allowed):
            return
        allowed = self._allowed
        unexpected = sorted(keys - allowed) if allowed is not None else []
        if unexpected and allowed is not None:
            # Name the misspelled keyword first: bind() would report only the
            # required one it misses ("missing 'url'" for {"ulr": ...}).
            missing = sorted(self._required - keys)
            parts = [
                f"unexpected keyword argument {name!r}" + suggest(name, allowed - keys)
                for name in unexpected
            ]
            if missing:
                parts.append("missing " + ", ".join(repr(name) for name in missing))
            raise PayloadError(
                f"args do not match task {self.name!r}{self._signature}: " + "; ".join(parts)
            )
        try:
            self._signature.bind(**args)
        except TypeError as exc:
            raise PayloadError(
                f"args do not match task {self.name!r}{self._signature}: {exc}"
            ) from None

    def options(
        self,
        *,
        queue: str | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        serial_key: str | None = None,
        connection: Any = None,
    ) -> TaskOptions:
        """Options for the next enqueue, e.g.
        ``resize.options(delay=30, unique_key="a.png").enqueue(path="a.png")``.

        Args: as for :meth:`jobkeeper.JobQueue.enqueue`. An unknown keyword
        raises ``TypeError`` naming it.
        """
        given = {
            "queue": queue,
            "delay": delay,
            "run_at": run_at,
            "priority": priority,
            "max_attempts": max_attempts,
            "unique_key": unique_key,
            "serial_key": serial_key,
            "connection": connection,
        }
        return TaskOptions(self, {k: v for k, v in given.items() if v is not None})

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue a job for this task with keyword arguments; returns once durable.

        Raises:
            PayloadError: positional arguments, args that are not JSON-native
                or too large, or args that do not match the function.
            DatabaseUnavailable: the database cannot be reached (nothing written).
        """
        if args:
            raise PayloadError(
                f"task {self.name!r}: pass arguments by keyword (jobs store a JSON object), "
                f"got {len(args)} positional"
            )
        return self.enqueue_with(dict(kwargs), {})

    def enqueue_with(self, args: dict[str, Any], options: dict[str, Any]) -> Job:
        """Enqueue with explicit ``args`` and ``options`` dicts."""
        return self._owner.enqueue(self.name, args, **options)

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """:meth:`enqueue` for async code: the event loop never waits on the
        database (see :meth:`jobkeeper.JobQueue.enqueue_async`).

        Raises:
            As :meth:`enqueue`.
        """
        if args:
            raise PayloadError(
                f"task {self.name!r}: pass arguments by keyword (jobs store a JSON object), "
                f"got {len(args)} positional"
            )
        return await self.enqueue_with_async(dict(kwargs), {})

    async def enqueue_with_async(self, args: dict[str, Any], options: dict[str, Any]) -> Job:
        """Enqueue (async) with explicit ``args`` and ``options`` dicts."""
        return await self._owner.enqueue_async(self.name, args, **options)


def _refuse_positional_only(
    name: str, fn: Callable[..., Any], params: Iterable[inspect.Parameter]
) -> None:
    """Refuse a function with a required positional-only parameter: jobs
    pass their args as keywords (a JSON object), so no job could ever bind
    it. One with a default is allowed: it always takes its default.

    Raises:
        ConfigError: naming the task, the function and the parameter.
    """
    for param in params:
        if param.kind is inspect.Parameter.POSITIONAL_ONLY and param.default is param.empty:
            raise ConfigError(
                f"task {name!r}: parameter {param.name!r} of "
                f"{getattr(fn, '__qualname__', fn)!r} is positional-only (before '/') and "
                "has no default, but a job passes its args by keyword (a JSON object), so "
                "no job could run it: make it a keyword parameter (drop the '/'), or give "
                "it a default"
            )


def check_backoff(
    backoff: Callable[[int, BaseException], float] | None,
) -> Callable[[int, BaseException], float] | None:
    """A task's ``backoff=``: None, or a callable taking ``(attempt, error)``.

    Raises:
        ConfigError: not callable, or its signature cannot take two
            positional arguments.
    """
    if backoff is None:
        return None
    if not callable(backoff):
        raise ConfigError(
            f"backoff must be a function (attempt, error) -> seconds, got {backoff!r}"
        )
    try:
        signature = inspect.signature(backoff)
    except (TypeError, ValueError):
        return backoff  # a builtin without a signature: judged when called
    try:
        signature.bind(1, RuntimeError())
    except TypeError:
        raise ConfigError(
            f"backoff must take two positional arguments (attempt, error), got "
            f"{getattr(backoff, '__name__', backoff)!r}{signature}"
        ) from None
    return backoff
