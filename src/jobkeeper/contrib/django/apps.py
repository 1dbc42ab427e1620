"""Django app config: lets ``INSTALLED_APPS`` find the management commands,
migrates jobkeeper's tables with Django's ``migrate``, and lets Django's test
runner copy and drop its databases while jobkeeper has connections open
(:mod:`jobkeeper.contrib.django.testdb`).
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.management.base import CommandError
from django.db.models.signals import post_migrate
from django.utils.module_loading import import_string

from jobkeeper.errors import JobkeeperError


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
        stdout = kwargs.get("stdout")
        if version is not None and stdout is not None and kwargs.get("verbosity", 1) >= 2:
            stdout.write(f"jobkeeper schema of TASKS[{alias!r}] at version {version}\n")
