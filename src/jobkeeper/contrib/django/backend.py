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
                "SETTINGS": {"retention": 3600},      # JobQueue keyword arguments
            },
        }
    }

Then ``@task`` functions enqueue jobkeeper jobs, and ``manage.py
jobkeeper_worker`` runs them (``manage.py jobkeeper_migrate`` creates the
tables first). Mapping:

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
  needed). Outside an atomic block the job is committed at once.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.db import close_old_connections, connections
from django.utils import timezone
from django.utils.module_loading import import_string

from jobkeeper import Job, JobQueue, JobStatus, current_job
from jobkeeper.tasks import Task as JobkeeperTask

try:  # Django >= 6.0
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
except ImportError:  # the django-tasks backport
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued

logger = logging.getLogger("jobkeeper.contrib.django")

#: jobkeeper status -> Django's task result status.
STATUSES = {
    JobStatus.SCHEDULED: TaskResultStatus.READY,
    JobStatus.AVAILABLE: TaskResultStatus.READY,
    JobStatus.RETRYABLE: TaskResultStatus.READY,
    JobStatus.CLAIMED: TaskResultStatus.RUNNING,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}

# Django makes one backend object per thread; the queue (and its PostgreSQL
# pool) is shared by every backend of the same alias and configuration.
_queues: dict[tuple[str, str, str], JobQueue] = {}
_queues_lock = threading.Lock()


def database_url(alias: str) -> str:
    """The jobkeeper URL of Django's database ``alias`` (SQLite or PostgreSQL).

    Raises:
        ValueError: another database engine.
    """
    config = settings.DATABASES[alias]
    engine = config["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{Path(config['NAME']).resolve()}"
    if "postgresql" in engine:
        return postgres_url(config)
    raise ValueError(
        f"DATABASES[{alias!r}] uses {engine}: jobkeeper supports sqlite3 and postgresql; "
        "set OPTIONS['DATABASE_URL'] in TASKS instead"
    )


def postgres_url(config: Mapping[str, Any]) -> str:
    """The ``postgresql://`` URL of a Django PostgreSQL ``DATABASES`` entry:
    what Django's own connection gets.

    ``OPTIONS`` keys that libpq knows (``sslrootcert``, ``service``,
    ``target_session_attrs``...) go in the query; Django's own
    (``isolation_level``, ``pool``...) do not. A ``HOST`` that is not a plain
    name or IPv4 address (a Unix socket's directory such as
    ``/var/run/postgresql``, several hosts ``h1,h2``, an IPv6 address) goes
    in the query too, with ``PORT``, as libpq reads it there whole.
    """
    from psycopg import pq  # the postgres extra: only a PostgreSQL entry needs it

    keywords = {default.keyword.decode() for default in pq.Conninfo.get_defaults()}
    user = quote(config.get("USER") or "", safe="")
    password = quote(str(config.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(config.get("HOST") or "")
    port = str(config.get("PORT") or "")
    query = {
        key: str(value)
        for key, value in (config.get("OPTIONS") or {}).items()
        if key in keywords and key not in ("host", "port", "user", "password", "dbname")
    }
    if any(mark in host for mark in "/,:%") or "," in port:
        where = {"host": host} if host else {}
        query = {**where, **({"port": port} if port else {}), **query}
        host = port = ""
    netloc = f"{credentials}{host}{f':{port}' if port else ''}"
    suffix = f"?{urlencode(query, quote_via=quote)}" if query else ""
    return f"postgresql://{netloc}/{quote(config.get('NAME') or '', safe='')}{suffix}"


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
        try:
            if django_task.takes_context:
                job = current_job()
                backend = django_task.get_backend()
                context = TaskContext(task_result=backend.result_of(job, django_task))
                return django_task.call(context, *args, **kwargs)
            return django_task.call(*args, **kwargs)
        finally:
            close_old_connections()

    run.__name__ = path.rpartition(".")[2]
    return run


class JobkeeperBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django task backend storing each task as a jobkeeper job (see the module
    docstring for the settings and the mapping).

    Args:
        alias: the key in ``TASKS``.
        params: its settings (``QUEUES``, ``OPTIONS``).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options: Mapping[str, Any] = self.options
        self.database_alias: str = options.get("DATABASE", "default")
        explicit = options.get("DATABASE_URL")
        self.database_url: str = explicit or database_url(self.database_alias)
        #: Whether enqueues inside ``transaction.atomic()`` join it (only when
        #: the jobs live in that Django database).
        self.join_transaction: bool = bool(options.get("JOIN_TRANSACTION", True)) and (
            not explicit or explicit == database_url(self.database_alias)
        )
        max_attempts = int(options.get("MAX_ATTEMPTS", 20))
        job_settings = dict(options.get("SETTINGS", {}))
        key = (alias, self.database_url, repr(sorted(job_settings.items())) + f"/{max_attempts}")
        with _queues_lock:
            queue = _queues.get(key)
            if queue is None:
                queue = JobQueue(self.database_url, **job_settings)
                queue.tasks = DjangoTasks(queue, max_attempts)
                # The registry fills lazily (a task by its dotted path, the
                # first time it is seen), so it never holds every name: it
                # cannot tell a misspelling from a task not loaded yet.
                if "external_tasks" not in job_settings:
                    queue.external_tasks = True
                _queues[key] = queue
        #: The :class:`jobkeeper.JobQueue` behind this backend.
        self.queue: JobQueue = queue

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
        job = self.queue.enqueue(
            task.module_path,
            {"args": list(args), "kwargs": dict(kwargs)},
            queue=task.queue_name,
            priority=-task.priority,
            run_at=run_at,
            connection=self._joined_connection(),
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
        """Django's ``TaskResult`` for ``job`` of ``task``."""
        finished = job.status in (JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED)
        payload = job.args or {}
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=STATUSES.get(job.status, TaskResultStatus.READY),
            enqueued_at=job.created_at,
            started_at=job.attempted_at,
            last_attempted_at=job.attempted_at,
            finished_at=job.finished_at if finished else None,
            args=list(payload.get("args", [])),
            kwargs=dict(payload.get("kwargs", {})),
            backend=self.alias,
            errors=[_task_error(error) for error in job.errors],
            worker_ids=[job.worker_id or "jobkeeper"] * job.attempt,
        )
        if job.status == JobStatus.COMPLETED:
            object.__setattr__(result, "_return_value", job.result)
        return result


def _task_error(error: Mapping[str, Any]) -> Any:
    """A Django ``TaskError`` from one of a job's ``errors``: the exception's
    dotted path comes from the traceback's last line (``module.Class: msg``),
    which Python writes without a module for built-in exceptions.
    """
    traceback = str(error.get("traceback") or error.get("error") or "")
    lines = traceback.strip().splitlines()
    last = lines[-1] if lines else ""
    name = last.partition(":")[0].strip() or "Exception"
    if "." not in name and hasattr(builtins, name):
        name = f"builtins.{name}"
    return TaskError(exception_class_path=name, traceback=traceback)
