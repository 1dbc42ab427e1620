"""Django app config: lets ``INSTALLED_APPS`` find the management commands,
migrates jobkeeper's tables with Django's ``migrate``, and lets Django's test
runner copy and drop its databases while jobkeeper has connections open
(:mod:`jobkeeper.contrib.django.testdb`).
"""

from __future__ import annotations

import sys
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db.models.signals import post_migrate
from django.utils.module_loading import import_string

from jobkeeper.errors import DatabaseUnavailable, JobkeeperError


class JobkeeperConfig(AppConfig):  # type: ignore[misc]
    name = "jobkeeper.contrib.django"
    label = "jobkeeper"
    verbose_name = "jobkeeper"

    def ready(self) -> None:
        from jobkeeper.contrib.django import database, testdb

        database.remember_configured_urls()
        post_migrate.connect(migrate_jobkeeper, sender=self)
        testdb.install()


def migrate_jobkeeper(using: str, **kwargs: Any) -> None:
    """After Django migrated (or flushed) database ``using``: migrate
    jobkeeper's tables there for each JobkeeperBackend (or subclass) whose
    jobs live in it (see ``JobkeeperBackend.migrate_with_django``).

    Raises:
        CommandError: jobkeeper's migration failed (a role without the
            rights to create its tables), saying how to do it apart.
    """
    from jobkeeper.contrib.django.backend import JobkeeperBackend, task_backends

    for alias, config in getattr(settings, "TASKS", {}).items():
        try:
            backend_class = import_string(str(config.get("BACKEND", "")))
        except ImportError:
            continue  # Django's own checks name it
        if not (isinstance(backend_class, type) and issubclass(backend_class, JobkeeperBackend)):
            continue
        backend = task_backends[alias]
        try:
            version = backend.migrate_with_django(using)
        except JobkeeperError as exc:
            raise CommandError(
                f"jobkeeper could not migrate its tables for TASKS[{alias!r}] in database "
                f"{using!r}: {exc}. Give this role the rights to, or set "
                f"TASKS[{alias!r}]['OPTIONS']['MIGRATE'] = False and run `manage.py "
                "jobkeeper_migrate` as a role that has them"
            ) from None
        stdout = kwargs.get("stdout") or sys.stdout
        verbosity = kwargs.get("verbosity", 1)
        if version is not None and verbosity >= 2:
            stdout.write(f"jobkeeper schema of TASKS[{alias!r}] at version {version}\n")
        elif version is None and verbosity >= 1:
            warning = _missed(alias, backend, using)
            if warning is not None:
                stdout.write(f"{warning}\n")


def _missed(alias: str, backend: Any, using: str) -> str | None:
    """What to say when Django's ``migrate`` of ``using`` leaves out the
    tables of a backend whose jobs live in another Django database (its
    ``OPTIONS["DATABASE"]``) that lacks them or has them behind: Django
    migrates one database per ``migrate``, and so does jobkeeper. None: the
    tables are there and current, the backend does not migrate with Django,
    or Django's test runner is migrating its test databases (each of them
    gets its own ``migrate``).
    """
    from jobkeeper.contrib.django.backend import _in_memory, _testing

    jobs = backend.database_alias
    if (
        not backend.migrates_with_django
        or backend.lives_in(using)
        or _in_memory(jobs)
        or _testing()
    ):
        return None
    state = "are missing or behind"
    try:
        queue = backend.queue
        if queue.backend.schema_version() >= queue.backend.schema_expected():
            return None
    except DatabaseUnavailable as exc:
        state = f"could not be checked ({exc}); once it answers, if they are missing or behind"
    except (JobkeeperError, ImproperlyConfigured):
        pass  # not there (a missing SQLite file)
    return (
        f"jobkeeper: the jobs of TASKS[{alias!r}] live in database {jobs!r}, which this "
        f"migrate (of {using!r}) did not touch, and jobkeeper's tables there {state}: "
        f"{backend.migrate_command()}"
    )
