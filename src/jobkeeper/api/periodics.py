"""Periodic jobs: registering them on a ``JobQueue`` and reading the stored ones."""

from __future__ import annotations

import weakref
from typing import Any, ParamSpec, TypeVar, overload

from jobkeeper.api.base import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, QueueBase, _PeriodicDecorator
from jobkeeper.config import Settings, check_age
from jobkeeper.errors import ConfigError, shown
from jobkeeper.maintenance.periodic import MAX_REFRESH
from jobkeeper.periodic import (
    DEFAULT_CATCH_UP,
    Periodic,
    PeriodicRegistry,
    PeriodicRow,
    unknown_option,
)
from jobkeeper.tasks import Task, suggest

#: Shortest ``stale_after`` of :meth:`PeriodicsMixin.periodic_prune`, seconds:
#: three of the workers' longest refresh periods.
MIN_PRUNE_STALE_AFTER = 3 * MAX_REFRESH

P = ParamSpec("P")
R = TypeVar("R")


class PeriodicsMixin(QueueBase):
    """Periodic jobs of :class:`~jobkeeper.JobQueue`."""

    # -- periodic jobs -----------------------------------------------------------

    def _new_periodic_registry(self) -> PeriodicRegistry:
        # Through a weak reference: a closure over self made a cycle, so a
        # queue dropped without close() kept its pool (sessions, threads)
        # until the cycle collector came by.
        queue = weakref.ref(self)

        def max_payload_bytes() -> int:
            alive = queue()
            return (Settings() if alive is None else alive.settings).max_payload_bytes

        return PeriodicRegistry(
            self.tasks,
            max_payload_bytes=max_payload_bytes,
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
            task: the call form: a Task or a task name. A name need not be
                registered yet: when a worker is made (see
                :meth:`check_periodics`) its args are checked against the
                task and the options left out become the task's; a JobQueue
                that registers tasks refuses then a name it neither registers
                nor lists in ``external_tasks``, as ``enqueue`` does.
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
                raise ConfigError(
                    f"periodic task= must be a Task or a task name, got {shown(task)}"
                )
            return register(task)

        def decorate(target: Task[P, R]) -> Task[P, R]:
            if not isinstance(target, Task):
                raise ConfigError(
                    f"@jq.periodic needs a task, got {shown(target)}: put it above @jq.task()"
                )
            register(target)
            return target

        return decorate

    def check_periodics(self) -> None:
        """Check the periodics against the tasks registered by now (a worker
        does when it is made; ``jobkeeper doctor --app`` too). Done then, not
        when a periodic is declared, because its task may be registered
        further down the module: args are checked against the task and the
        options left out become the task's (see
        :meth:`~jobkeeper.periodic.PeriodicRegistry.bind`).

        Raises:
            ConfigError: naming the periodic: args that do not match its task,
                or, when this JobQueue registers tasks, a task it neither
                registers nor lists in ``external_tasks``.
        """
        self.periodics.bind()
        declared = self.external_tasks
        for periodic in self.periodics.values():
            if not self.tasks or periodic.task in self.tasks:
                continue
            if declared is True or (declared is not False and periodic.task in declared):
                continue
            raise ConfigError(
                f"periodic {periodic.name!r}: unknown task {periodic.task!r}"
                f"{suggest(periodic.task, self.tasks)}: no task of this JobQueue has that"
                " name; if another service runs it, list it in"
                " JobQueue(external_tasks=[...])"
            )

    def periodic_list(self, *, stale_after: float | None = None) -> list[PeriodicRow]:
        """The stored periodic jobs (every app's, not only this one's), by name.

        Args:
            stale_after: seconds without a pass of a worker registering a
                periodic after which it is ``stale`` (default: ``rescue_after``,
                at least three of the workers' longest refresh periods, 15 s):
                no running worker registers it any more.

        Raises:
            ConfigError: ``stale_after`` is not a number of seconds >= 0, or
                is longer than 100 years.
        """
        return self.backend.periodic_list(stale_after=self._stale_after(stale_after))

    def periodic_prune(self, *, stale_after: float | None = None) -> list[str]:
        """Delete the stale periodic rows (see :meth:`periodic_list`); return
        their names. A periodic pruned while its workers are all down starts
        afresh when they return (no catch-up of the ticks missed meanwhile).

        Args:
            stale_after: seconds, as for :meth:`periodic_list`, at least
                ``MIN_PRUNE_STALE_AFTER`` (15): a live worker passes every
                5 s at most, and a shorter window would prune its periodic
                between two passes and lose a tick.

        Raises:
            ConfigError: ``stale_after`` is not a number of seconds, is
                below ``MIN_PRUNE_STALE_AFTER`` or longer than 100 years.
        """
        window = self._stale_after(stale_after)
        if window < MIN_PRUNE_STALE_AFTER:
            raise ConfigError(
                f"stale_after={stale_after!r} is below {MIN_PRUNE_STALE_AFTER:g} seconds: a running"
                f" worker refreshes its periodics only every {MAX_REFRESH:g} s, so live ones"
                " would be pruned"
            )
        return self.backend.periodic_prune(stale_after=window)

    def _stale_after(self, stale_after: float | None) -> float:
        if stale_after is None:
            return max(self.settings.rescue_after, MIN_PRUNE_STALE_AFTER)
        # At most 100 years, as every age: PostgreSQL's timestamps end in
        # 294276 AD, and 1e12 s before now failed there as "timestamp out of
        # range" (exit 1) where SQLite accepted it.
        return check_age("stale_after", stale_after)
