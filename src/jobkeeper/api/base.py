"""The state every part of ``JobQueue`` shares, and the checks they share."""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, Protocol, TypeVar

from jobkeeper.backends import Backend, open_backend
from jobkeeper.config import Settings, check_name
from jobkeeper.database_url import DatabaseURL
from jobkeeper.errors import ConfigError, shown
from jobkeeper.events import EventBus
from jobkeeper.models import MAX_JOB_ID, JobStatus
from jobkeeper.periodic import PeriodicRegistry
from jobkeeper.tasks import ENQUEUE_OPTIONS, Task
from jobkeeper.tracing import Tracing

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_QUEUE = "default"


class _TaskDecorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class _PeriodicDecorator(Protocol):
    def __call__(self, task: Task[P, R], /) -> Task[P, R]: ...


#: Options a job may carry (``connection`` belongs to the call, not the job).
_JOB_OPTIONS = frozenset(ENQUEUE_OPTIONS) - {"connection"}
#: What ``enqueue``/``enqueue_async`` hand to ``_new_job``: the job options and
#: ``external`` (the task runs in another service's code).
_CALL_OPTIONS = _JOB_OPTIONS | {"external"}
RETRYABLE_FROM = frozenset(
    {JobStatus.DEAD, JobStatus.RETRYABLE, JobStatus.CANCELLED, JobStatus.COMPLETED}
)
DEFAULT_MAX_ATTEMPTS = 20

#: Called with every queue about to use its database while a check is set
#: (:func:`check_database_use`); None, the rule, costs one comparison.
_database_check: Callable[[QueueBase], None] | None = None


def check_database_use(check: Callable[[QueueBase], None] | None) -> None:
    """Have ``check`` called with each queue of this process about to use its
    database (every enqueue, read, drain and worker goes through
    :attr:`QueueBase.backend`), or stop with None.

    The pytest plugin's ``jobkeeper_queue`` fixture sets one for a test, which
    raises when a queue is not on the test's database: the application's tasks
    would otherwise write jobs to the developer's real one.

    Args:
        check: raises to refuse the use; None removes the check.
    """
    global _database_check
    _database_check = check


class QueueBase:
    """What every part of :class:`~jobkeeper.JobQueue` shares: its URL,
    settings, tasks, periodics, events and the backend opened on first use.
    """

    url: DatabaseURL
    settings: Settings
    tasks: dict[str, Task[Any, Any]]
    external_tasks: frozenset[str] | bool
    periodics: PeriodicRegistry
    events: EventBus
    _tracing: Tracing | None
    _backend: Backend | None
    _backend_lock: threading.Lock
    #: Closes the backend if the queue is collected without close().
    _backend_released: weakref.finalize[Any, Any] | None = None

    @property
    def backend(self) -> Backend:
        """The backend (created on first use).

        Raises:
            Exception: whatever a check set by :func:`check_database_use`
                raises (the pytest plugin's: a queue not on the test's database).
        """
        if _database_check is not None:
            _database_check(self)
        if self._backend is None:
            with self._backend_lock:
                if self._backend is None:
                    backend = open_backend(self.url, self.settings)
                    self._backend = backend
                    self._backend_released = weakref.finalize(
                        self, _release_dropped, backend, os.getpid()
                    )
                    # At exit, pool_exit closes the pools still open.
                    self._backend_released.atexit = False
        return self._backend

    def close(self) -> None:
        """Close the queue's connections (it reconnects if used again)."""
        with self._backend_lock:
            # Forgotten before it is closed: a Ctrl-C during the close must
            # not leave a closed backend in place, refusing every later call.
            backend, self._backend = self._backend, None
            released = getattr(self, "_backend_released", None)
            if released is not None:
                released.detach()
            if backend is not None:
                backend.close()
                # The wait's LISTEN (or data_version) connection too, unless
                # someone waits on it: it stayed open IDLE_STOP seconds more.
                backend.completion_watch().stop_if_idle()


def _release_dropped(backend: Backend, opened_by: int) -> None:
    """Close the backend of a queue collected without ``close()``: its
    pooled sessions, their threads and the wait's connection stayed open
    for the life of the process (a queue made per request and dropped held
    2 sessions and 4 threads each). On a thread of its own: closing joins the
    pool's threads, and the collection may run on any thread, a loop's
    included. Not in a forked child, whose inherited sessions are the
    parent's.
    """
    if os.getpid() != opened_by:
        return

    def release() -> None:
        try:
            backend.close()
            backend.completion_watch().stop_if_idle()
        except Exception:  # noqa: BLE001 - nobody to tell: the queue is gone
            pass

    threading.Thread(target=release, name="jobkeeper-release", daemon=True).start()


def _job_id(job_id: Any) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id <= MAX_JOB_ID:
        raise ConfigError(f"job id must be a positive 64-bit int, got {shown(job_id)}")
    return job_id


def _external_tasks(value: Iterable[str] | bool) -> frozenset[str] | bool:
    """``external_tasks`` checked: True, or a set of valid task names."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(
            f"external_tasks must be a list of task names or True, got {shown(value)}"
        )
    return frozenset(check_name("task", name) for name in value)


def _given(values: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """The enqueue options among ``values`` (a call's ``locals()``) that were given."""
    # external=False is the default, not an option given.
    return {
        name: values[name]
        for name in _sorted_names(names)
        if values.get(name) is not None and not (name == "external" and values[name] is False)
    }


@functools.lru_cache(maxsize=8)
def _sorted_names(names: frozenset[str]) -> tuple[str, ...]:
    # Sorted once: on every enqueue it was a few percent of its own CPU.
    return tuple(sorted(names))
