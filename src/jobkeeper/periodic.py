"""Periodic jobs: what ``@jq.periodic`` registers, and a stored row.

A :class:`Periodic` is a job template (task, args, queue, priority,
max_attempts) plus a :class:`~jobkeeper.Schedule`. Every worker whose app
registers it enqueues its ticks (``jobkeeper.maintenance.periodic``); the
database decides which worker's insert wins, so each tick is enqueued once
however many workers run it. The ``jobkeeper_periodic`` table keeps one row
per name (:class:`PeriodicRow`): the schedule the code last registered, the
last tick enqueued, and when a worker registering it last passed.

Pure: no database, no clock.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, NamedTuple, NoReturn, Protocol

from jobkeeper.config import check_max_attempts, check_name, check_priority
from jobkeeper.errors import ConfigError, PayloadError, shown
from jobkeeper.payload import encode_args
from jobkeeper.schedule import MAX_EVERY, Schedule

__all__ = [
    "DEFAULT_CATCH_UP",
    "OVERDUE_AFTER",
    "PERIODIC_OPTIONS",
    "Periodic",
    "PeriodicRegistry",
    "PeriodicRow",
    "PeriodicTouch",
    "periodic_from_row",
]

#: Seconds a missed tick may be late and still be enqueued (see ``catch_up``).
DEFAULT_CATCH_UP = 60.0
#: Seconds a periodic's next tick may lie in the past while a worker still
#: fires it: a running worker enqueues each tick as it comes due and passes
#: at least every 5 s (``maintenance.periodic.MAX_REFRESH``), so a tick two
#: passes late (``ALIVE_SLACK``) is one no worker is firing.
OVERDUE_AFTER = 10.0
#: The keyword options of ``jq.periodic``.
PERIODIC_OPTIONS = (
    "every",
    "timezone",
    "task",
    "args",
    "name",
    "queue",
    "priority",
    "max_attempts",
    "catch_up",
)


class TaskLike(Protocol):
    """What registration needs of a :class:`~jobkeeper.Task`."""

    name: str
    queue: str
    priority: int
    max_attempts: int

    def check_args(self, args: dict[str, Any]) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Periodic:
    """One registered periodic job.

    Attributes:
        name: unique per JobQueue and per database (default: the task's name).
        schedule: when it ticks.
        task: the task name its jobs run.
        args: the jobs' keyword arguments; ``args_json`` is their stored text.
        queue: the jobs' queue.
        priority: the jobs' priority (lower runs first).
        max_attempts: the jobs' attempt limit.
        catch_up: seconds; a tick missed while no worker ran is still
            enqueued when it is at most this old, else skipped (0: never).
    """

    name: str
    schedule: Schedule
    task: str
    args: dict[str, Any]
    args_json: str
    queue: str
    priority: int
    max_attempts: int
    catch_up: float = DEFAULT_CATCH_UP

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refuse use as a decorator: ``@jq.periodic(..., task="x")`` above a
        function raised "'Periodic' object is not callable", which did not
        say that ``task=`` is the call form (it registers the periodic and
        returns it; the function below is neither a task nor scheduled).

        Raises:
            ConfigError: always, saying which form to use.
        """
        of = getattr(args[0], "__qualname__", None) if args else None
        raise ConfigError(
            f"jq.periodic(..., task={self.task!r}) is the call form: it registered periodic "
            f"{self.name!r} and returns it, not a decorator"
            + (f" (it was used on {of})" if of else "")
            + "; to schedule a function, drop task= and put @jq.periodic(...) above @jq.task()"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class PeriodicRow:
    """One row of ``jobkeeper_periodic`` (times are aware, UTC, database clock).

    Attributes:
        name: the periodic's name.
        schedule: ``str(Schedule)``: the cron expression or ``"every 30s"``.
        timezone: the IANA time zone of the cron fields (``"UTC"`` for intervals).
        task, queue, priority, max_attempts, args: the template of its jobs.
        catch_up: seconds (see :attr:`Periodic.catch_up`).
        since_at: ticks at or before it are not owed: when the definition
            was first seen or last replaced, or the last missed tick skipped.
        last_tick_at: the last tick enqueued, or None.
        next_tick_at: the next tick, as the last worker to pass computed it.
        seen_at: when a worker registering this very definition last passed.
        stale: no worker registering it has passed for the ``stale_after``
            the list was read with: no running worker registers it.
    """

    name: str
    schedule: str
    timezone: str
    task: str
    queue: str
    priority: int
    max_attempts: int
    args: dict[str, Any]
    catch_up: float
    since_at: datetime
    last_tick_at: datetime | None
    next_tick_at: datetime | None
    seen_at: datetime
    stale: bool

    def overdue(self, now: datetime) -> bool:
        """Whether the next tick is more than ``OVERDUE_AFTER`` seconds before
        ``now`` (the database clock, as the row's times): no worker is firing
        it, because none registering it runs (``stale``) or because the last
        one stopped less than ``stale_after`` ago. Its workers, when they
        return, enqueue or skip the missed ticks as ``catch_up`` says.
        """
        if self.next_tick_at is None:
            return False
        return (now - self.next_tick_at).total_seconds() > OVERDUE_AFTER

    def to_dict(self) -> dict[str, Any]:
        """The stable ``periodic list --json`` shape (keys are only ever added)."""

        def when(value: datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "name": self.name,
            "schedule": self.schedule,
            "timezone": self.timezone,
            "task": self.task,
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "args": self.args,
            "catch_up": self.catch_up,
            "last_tick_at": when(self.last_tick_at),
            "next_tick_at": when(self.next_tick_at),
            "seen_at": when(self.seen_at),
            "stale": self.stale,
        }


class PeriodicTouch(NamedTuple):
    """A worker's "still registered here" for one periodic (``periodic_touch``).

    Attributes:
        name, schedule, timezone: the definition the worker runs
            (``schedule`` is ``str(Schedule)``).
        next_tick_at: its next tick after the pass, aware UTC.
    """

    name: str
    schedule: str
    timezone: str
    next_tick_at: datetime | None


def _catch_up(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"catch_up must be a number of seconds, got {shown(value)}")
    if not (math.isfinite(value) and 0 <= value <= MAX_EVERY):
        raise ConfigError(f"catch_up must be between 0 and {MAX_EVERY} seconds, got {shown(value)}")
    return float(value)


class PeriodicRegistry(Mapping[str, Periodic]):
    """The periodics of one JobQueue, by name (what ``jq.periodic`` fills).

    Args:
        tasks: the queue's task registry (name -> Task), read at registration.
        max_payload_bytes: largest encoded args, bytes.
        defaults: ``(queue, priority, max_attempts)`` for a task not
            registered in this process.
    """

    def __init__(
        self,
        tasks: Mapping[str, TaskLike],
        *,
        max_payload_bytes: Callable[[], int],
        defaults: tuple[str, int, int],
    ) -> None:
        self._tasks = tasks
        self._max_payload_bytes = max_payload_bytes
        self._defaults = defaults
        self._by_name: dict[str, Periodic] = {}
        #: What ``register`` was given for the periodics whose task was not
        #: registered yet (declared above ``@jq.task``, or by name), by name:
        #: :meth:`bind` checks them against the task once it is.
        self._unbound: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> Periodic:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"<PeriodicRegistry {sorted(self._by_name)}>"

    def register(
        self,
        task: TaskLike | str,
        *,
        cron: str | None,
        every: float | None,
        timezone: str,
        args: dict[str, Any] | None,
        name: str | None,
        queue: str | None,
        priority: int | None,
        max_attempts: int | None,
        catch_up: float,
    ) -> Periodic:
        """Validate one periodic completely and add it.

        Raises:
            ConfigError: naming the input: an invalid expression, time zone,
                interval, name, option or catch_up; args that are not a JSON
                object of JSON-native values or do not match the task; a
                second periodic with the same name.
        """
        options: dict[str, Any] = {
            "cron": cron,
            "every": every,
            "timezone": timezone,
            "args": args,
            "name": name,
            "queue": queue,
            "priority": priority,
            "max_attempts": max_attempts,
            "catch_up": catch_up,
        }
        periodic = self._build(task, options)
        if periodic.name in self._by_name:
            raise ConfigError(
                f"a periodic named {periodic.name!r} is already registered"
                f" ({self._by_name[periodic.name].schedule.key}); pass name= to tell them apart"
            )
        self._by_name[periodic.name] = periodic
        if isinstance(task, str) and periodic.task not in self._tasks:
            self._unbound[periodic.name] = {**options, "task": periodic.task}
        return periodic

    def bind(self) -> list[str]:
        """Check again, against their task, the periodics declared before it
        was registered: their args must fit it, and the options they left out
        become the task's (queue, priority, max_attempts). A worker calls this
        when it is made, so a periodic above ``@jq.task`` cannot fail every
        tick at run time.

        Returns:
            The task names still not registered in this process (the caller
            decides whether they are external).

        Raises:
            ConfigError: naming the periodic: args that do not match the task.
        """
        for name, options in list(self._unbound.items()):
            if options["task"] in self._tasks:
                rest = {key: value for key, value in options.items() if key != "task"}
                self._by_name[name] = self._build(options["task"], rest)
                del self._unbound[name]
        return sorted({options["task"] for options in self._unbound.values()})

    def _build(self, task: TaskLike | str, options: dict[str, Any]) -> Periodic:
        """One periodic from ``register``'s arguments, validated."""
        cron, every, timezone = options["cron"], options["every"], options["timezone"]
        args, name, catch_up = options["args"], options["name"], options["catch_up"]
        queue, priority = options["queue"], options["priority"]
        max_attempts = options["max_attempts"]
        registered: TaskLike | None
        if isinstance(task, str):
            task_name = check_name("task", task)
            registered = self._tasks.get(task_name)
        else:
            registered, task_name = task, task.name
        label = name if isinstance(name, str) else task_name
        try:
            periodic_name = check_name("periodic", label)
            schedule = Schedule(cron, timezone=timezone, every=every)
            values = {} if args is None else args
            try:
                args_json = encode_args(values, max_bytes=self._max_payload_bytes())
                if registered is not None:
                    registered.check_args(values)
            except PayloadError as exc:
                raise ConfigError(str(exc)) from None
            default_queue, default_priority, default_attempts = self._defaults
            periodic = Periodic(
                name=periodic_name,
                schedule=schedule,
                task=task_name,
                args=dict(values),
                args_json=args_json,
                queue=check_name("queue", queue)
                if queue is not None
                else (registered.queue if registered else default_queue),
                priority=check_priority(priority)
                if priority is not None
                else (registered.priority if registered else default_priority),
                max_attempts=check_max_attempts(max_attempts)
                if max_attempts is not None
                else (registered.max_attempts if registered else default_attempts),
                catch_up=_catch_up(catch_up),
            )
        except ConfigError as exc:
            raise ConfigError(f"periodic {label!r}: {exc}") from None
        return periodic


def unknown_option(options: Mapping[str, Any]) -> ConfigError:
    """The error for ``jq.periodic(..., bogus=1)``."""
    return ConfigError(
        f"unknown periodic option {sorted(options)[0]!r}; valid options: "
        + ", ".join(PERIODIC_OPTIONS)
    )


def periodic_from_row(
    row: Mapping[str, Any], to_datetime: Callable[[Any], datetime | None]
) -> PeriodicRow:
    """A :class:`PeriodicRow` from a ``periodic_list`` row (for the backends).

    Args:
        row: column -> value; ``args`` as decoded JSON or as JSON text.
        to_datetime: the backend's stored time -> aware UTC datetime.
    """
    args = row["args"]
    if isinstance(args, str | bytes):
        args = json.loads(args)

    def required(column: str) -> datetime:
        value = to_datetime(row[column])
        assert value is not None, column  # NOT NULL columns
        return value

    return PeriodicRow(
        name=row["name"],
        schedule=row["schedule"],
        timezone=row["timezone"],
        task=row["task"],
        queue=row["queue"],
        priority=int(row["priority"]),
        max_attempts=int(row["max_attempts"]),
        args=args if isinstance(args, dict) else {},
        catch_up=float(row["catch_up"]),
        since_at=required("since_at"),
        last_tick_at=to_datetime(row["last_tick_at"]),
        next_tick_at=to_datetime(row["next_tick_at"]),
        seen_at=required("seen_at"),
        stale=bool(row["stale"]),
    )
