"""A backend for Django's task framework that stores tasks as jobkeeper jobs.

Django 6.0 has a task framework (``django.tasks``); older Djangos get the same
API from the ``django-tasks`` backport. Either one finds this backend through
the ``TASKS`` setting::

    INSTALLED_APPS = [..., "jobkeeper.contrib.django"]   # manage.py jobkeeper_worker
    TASKS = {
        "default": {
            "BACKEND": "jobkeeper.contrib.django.backend.JobkeeperBackend",
            "QUEUES": ["default", "emails"],          # what workers serve by default
            "OPTIONS": {
                # All optional:
                "DATABASE": "default",                # the Django database to use
                "DATABASE_URL": None,                 # or any jobkeeper URL instead
                "MAX_ATTEMPTS": 20,                   # per task: attempts before dead
                "JOIN_TRANSACTION": True,             # see below
                "MIGRATE": True,                      # manage.py migrate migrates jobkeeper too
                "SETTINGS": {"retention": 3600},      # JobQueue keyword arguments
            },
        }
    }

Then ``@task`` functions enqueue jobkeeper jobs, and ``manage.py
jobkeeper_worker`` runs them. ``manage.py migrate`` creates or upgrades
jobkeeper's tables in the jobs' Django database after Django's own (unless
``MIGRATE`` is False; ``manage.py jobkeeper_migrate`` does it alone), so the
test runner's test database gets them too. Mapping:

- A Django task is the jobkeeper task named by its dotted path
  (``myapp.tasks.send_email``); its positional and keyword arguments are the
  job's args ``{"args": [...], "kwargs": {...}}``. Workers import the task by
  that path: nothing needs registering.
- ``queue_name`` is the queue; ``run_after`` the job's ``run_at``; Django's
  ``priority`` (higher runs first) is negated into jobkeeper's (lower runs
  first).
- A result id is the job id. ``get_result`` reads the job: ``READY`` while it
  waits (also between retries), ``RUNNING`` while a worker holds it,
  ``SUCCESSFUL`` once completed, ``FAILED`` once dead or cancelled; one
  ``TaskError`` per failed attempt. Unlike Django's immediate backend, a task
  that raises is retried (with backoff) up to ``MAX_ATTEMPTS``, and may raise
  :class:`jobkeeper.Retry` or :class:`jobkeeper.Discard`.
- ``JOIN_TRANSACTION``: an ``enqueue()`` inside ``transaction.atomic()`` on
  the backend's Django database writes the job in that transaction, so it is
  committed or rolled back with the rest (no ``transaction.on_commit``
  needed); into a block an error has already doomed it raises Django's
  ``TransactionManagementError``. Outside an atomic block the job is
  committed at once, except on SQLite while this thread's Django connection
  holds the file's write lock (see :mod:`jobkeeper.contrib.django.locks`).
- A worker sends Django's ``task_started`` and ``task_finished`` for each
  attempt (:mod:`jobkeeper.contrib.django.signals`).
- The backend's queue follows its Django database: while Django's test runner
  has the test database in place, jobs go there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections
from django.utils import timezone
from django.utils.module_loading import import_string

from jobkeeper import Job, JobQueue, current_job
from jobkeeper.contrib.django import database, locks, signals
from jobkeeper.contrib.django.database import QUEUES
from jobkeeper.contrib.django.options import checked_options
from jobkeeper.contrib.django.results import task_result
from jobkeeper.errors import ConfigError
from jobkeeper.tasks import Task as JobkeeperTask

try:  # Django >= 6.0
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
    from django.utils.json import normalize_json
except ImportError:  # the django-tasks backport
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued
    from django_tasks.utils import normalize_json

__all__ = ["JobkeeperBackend", "task_backends"]

logger = logging.getLogger("jobkeeper.contrib.django")


class DjangoTasks(dict[str, JobkeeperTask[Any, Any]]):
    """A JobQueue's task registry that finds Django tasks by their dotted path
    the first time a job of one is enqueued or run (what the executor and
    ``enqueue`` look up with ``get``).
    """

    def __init__(self, queue: JobQueue, max_attempts: int) -> None:
        super().__init__()
        self._queue = queue
        self._max_attempts = max_attempts
        self._lock = threading.Lock()

    def get(self, name: str, default: Any = None) -> Any:
        found = super().get(name)
        if found is None:
            found = self._load(name)
        return found if found is not None else default

    def _load(self, name: str) -> JobkeeperTask[Any, Any] | None:
        try:
            django_task = import_string(name)
        except ImportError:
            return None
        except Exception:
            # The module exists but raised while imported: the job's attempt
            # fails as an unknown task (and is retried) instead of the
            # lookup breaking the worker.
            logger.exception("importing task %s failed", name)
            return None
        if not isinstance(django_task, Task):
            return None
        with self._lock:
            found = super().get(name)
            if found is not None:
                return found
            return self._queue.task(
                name=name,
                queue=django_task.queue_name,
                priority=-django_task.priority,
                max_attempts=self._max_attempts,
            )(_runner(name))


def _runner(path: str) -> Any:
    """The jobkeeper task function that runs the Django task at ``path``."""

    def run(args: list[Any], kwargs: dict[str, Any]) -> Any:
        django_task = import_string(path)
        # As Django does around a request: connections that broke or outlived
        # CONN_MAX_AGE are not reused by this worker thread.
        close_old_connections()
        job = current_job()
        try:
            if django_task.takes_context:
                backend = django_task.get_backend()
                context = TaskContext(task_result=backend.result_of(job, django_task))
                returned = django_task.call(context, *args, **kwargs)
            else:
                returned = django_task.call(*args, **kwargs)
        finally:
            close_old_connections()
        signals.note_return(job.id, job.attempt, returned)  # for task_finished
        return returned

    run.__name__ = path.rpartition(".")[2]
    return run


class JobkeeperBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django task backend storing each task as a jobkeeper job (see the module
    docstring for the settings and the mapping).

    Args:
        alias: the key in ``TASKS``.
        params: its settings (``QUEUES``, ``OPTIONS``).

    Raises:
        ImproperlyConfigured: an ``OPTIONS`` entry of the wrong type or value,
            naming it; a ``DATABASE`` that ``DATABASES`` lacks or whose engine
            jobkeeper cannot use.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        if isinstance(params.get("QUEUES"), str):
            # Django would take the string's letters as the queue names.
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names, "
                f"got {params['QUEUES']!r}"
            )
        super().__init__(alias, params)
        options = checked_options(alias, self.options)
        #: The Django database the jobs live in (unless ``DATABASE_URL``).
        self.database_alias: str = options["DATABASE"]
        explicit: str | None = options["DATABASE_URL"]
        # A URL that is the Django database's own is that database: the queue
        # follows it into the test database, and migrates with it.
        # Compared with the alias as configured, not as a test runner renamed
        # it: a backend made on a thread after the swap must decide the same.
        if explicit is not None and database.same_database(
            explicit, database.configured_url(self.database_alias)
        ):
            explicit = None
        self._explicit_url = explicit
        #: Whether Django's ``migrate`` also migrates jobkeeper's tables.
        self.migrates_with_django: bool = options["MIGRATE"] and explicit is None
        #: Whether enqueues inside ``transaction.atomic()`` join it (only when
        #: the jobs live in that Django database).
        self.join_transaction: bool = options["JOIN_TRANSACTION"] and explicit is None
        self._max_attempts: int = options["MAX_ATTEMPTS"]
        self._job_settings: dict[str, Any] = options["SETTINGS"]
        self._key = (
            alias,
            self._explicit_url or f"django:{self.database_alias}",
            repr(sorted(self._job_settings.items())),
            str(self._max_attempts),
        )
        try:
            self._kept_queue()
        except ImproperlyConfigured:
            # An in-memory SQLite database (Django's default test database)
            # is refused when the queue is used, not here: a test run that
            # imports tasks but never enqueues one still runs.
            if self._explicit_url or not _in_memory(self.database_alias):
                raise

    @property
    def queue(self) -> JobQueue:
        """The :class:`jobkeeper.JobQueue` behind this backend: one for every
        thread's backend object of the same alias and settings. With the jobs
        in a Django database it follows that database, the test database
        while Django's test runner has it in place.

        Under Django's test runner (or pytest-django) the queue of a Django
        database may be used only where the test may use that database: in a
        ``SimpleTestCase``, a test whose ``databases`` lacks it, or a test
        without pytest-django's ``django_db`` mark, using it raises Django's
        own error, as a query would. It would reach the real database, which
        the test runner set up no test database for.

        Raises:
            ImproperlyConfigured: the Django database is an in-memory SQLite
                database.
        """
        if self._explicit_url is None and _testing():
            # Django's own check of its connection: raises where the test
            # may not use the database, does nothing (one cursor) otherwise.
            connections[self.database_alias].cursor().close()
        return self._kept_queue()

    @property
    def database_url(self) -> str:
        """The URL of the database the jobs live in (see :attr:`queue`)."""
        return str(self.queue.url.url)

    def _kept_queue(self) -> JobQueue:
        if QUEUES.get(self._key) is None:
            url = self._explicit_url or database.database_url(self.database_alias)
            try:
                queue = JobQueue(url, **self._job_settings)
            except (ConfigError, TypeError) as exc:
                raise ImproperlyConfigured(f"TASKS[{self.alias!r}]['OPTIONS']: {exc}") from None
            # Every error and log line that asks for a migration (the
            # worker's own included) names manage.py's command.
            queue.url = dataclasses.replace(queue.url, migrate_command=self.migrate_command())
            queue.tasks = DjangoTasks(queue, self._max_attempts)
            # The registry fills lazily (a task by its dotted path, the
            # first time it is seen), so it never holds every name: it
            # cannot tell a misspelling from a task not loaded yet.
            if "external_tasks" not in self._job_settings:
                queue.external_tasks = True
            queue.on_event(signals.TaskSignals(self.alias), signals.TaskSignals.KINDS)
            follows = None if self._explicit_url else self.database_alias
            QUEUES.add(self._key, queue, follows)
        return QUEUES.follow(self._key)

    def migrate_with_django(self, using: str) -> int | None:
        """Migrate jobkeeper's tables after Django's ``migrate`` (or ``flush``)
        of database ``using``, when the jobs live there and ``OPTIONS
        ["MIGRATE"]`` is on; returns the schema version, or None when it did
        not migrate. An in-memory SQLite database is left alone (its use is
        refused, see :attr:`queue`).
        """
        if not self.migrates_with_django or _in_memory(self.database_alias):
            return None
        url = database.url_or_none(using)
        if url is None or not self.lives_in(using):
            return None
        mirrors = (settings.DATABASES[self.database_alias].get("TEST") or {}).get("MIRROR")
        queue = self._kept_queue()
        if mirrors != using or queue.url.url == url:
            return queue.migrate()
        # The mirror is not pointed there yet: migrate the database it will be.
        with queue.using(url) as mirrored:
            return mirrored.migrate()

    def lives_in(self, using: str) -> bool:
        """Whether the jobs live in Django database ``using`` (always False
        with a ``DATABASE_URL`` of another database).
        """
        if self._explicit_url is not None:
            return False
        # By database, not alias: another alias of the same database, or the
        # one the jobs' alias mirrors in tests (TEST["MIRROR"]: the test runner
        # points the mirror at that alias's test database only after it made
        # and migrated it), is the jobs' database too.
        mirrors = (settings.DATABASES[self.database_alias].get("TEST") or {}).get("MIRROR")
        url = database.url_or_none(using)
        return url is not None and (
            using in (self.database_alias, mirrors)
            or database.same_database(url, database.url_or_none(self.database_alias))
        )

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Store a job for ``task`` (Django calls this from ``task.enqueue()``).

        Raises:
            InvalidTaskError: Django's checks (queue, priority, run_after).
            PayloadError: arguments that are not JSON values.
        """
        self.validate_task(task)
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):
            run_at = timezone.make_aware(run_at)
        queue = self.queue
        joined = self._joined_connection()
        own = locks.own_write(queue) if joined is None else contextlib.nullcontext()
        with own:
            job = queue.enqueue(
                task.module_path,
                _task_args(args, kwargs),
                queue=task.queue_name,
                priority=-task.priority,
                run_at=run_at,
                connection=joined,
            )
        result = self.result_of(job, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _joined_connection(self) -> Any:
        if not self.join_transaction:
            return None
        connection = connections[self.database_alias]
        return connection if connection.in_atomic_block else None

    def get_result(self, result_id: str) -> Any:
        """The result of the job ``result_id`` (a job id), as stored now.

        Raises:
            TaskResultDoesNotExist: no such job (or it was pruned after
                ``retention``), or it is not a Django task's.
        """
        try:
            job = self.queue.get_job(int(result_id))
        except (TypeError, ValueError):
            job = None
        task = None
        if job is not None:
            try:
                task = import_string(job.task)
            except ImportError:
                task = None
        if job is None or not isinstance(task, Task):
            raise TaskResultDoesNotExist(result_id)
        return self.result_of(job, task)

    def result_of(self, job: Job, task: Any) -> Any:
        """Django's ``TaskResult`` for ``job`` of ``task``: ``attempts`` counts
        the attempts started; ``worker_ids`` holds the worker that holds the
        job while it is claimed or running, else nothing (jobkeeper records
        no worker per attempt); ``started_at`` and ``last_attempted_at`` are
        the start of the current (or last) attempt.
        """
        return task_result(self.alias, job, task)

    def migrate_command(self) -> str:
        """What to run to create or upgrade this backend's tables, as a
        Django project does (the hint of an error that finds them missing).
        """
        flag = "" if self.alias == "default" else f" --backend {self.alias}"
        command = f"python manage.py jobkeeper_migrate{flag}"
        if not self.migrates_with_django:
            return f"run `{command}`"
        where = "" if self.database_alias == "default" else f" --database {self.database_alias}"
        return f"run `python manage.py migrate{where}` (or `{command}`)"


def _task_args(args: Any, kwargs: Any) -> dict[str, Any]:
    """A Django task's arguments as the job's args: JSON values as Django's
    own backends store them (tuples as lists, bytes as text). Values it cannot
    convert go as given, for jobkeeper's validation to name the field.
    """
    payload = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        normalized: dict[str, Any] = normalize_json(payload)
    except (TypeError, ValueError):
        return payload
    return normalized


def _testing() -> bool:
    """Whether Django's test environment is set up (``setup_test_environment``,
    which Django's test runner and pytest-django call): it gives
    ``django.core.mail`` its ``outbox``.
    """
    return hasattr(mail, "outbox")


def _in_memory(alias: str) -> bool:
    config = settings.DATABASES.get(alias) or {}
    return str(config.get("ENGINE", "")).endswith("sqlite3") and database.is_in_memory(
        str(config.get("NAME") or "")
    )
