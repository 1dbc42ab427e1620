"""Django app config: lets ``INSTALLED_APPS`` find the management commands,
migrates jobkeeper's tables with Django's ``migrate``, and lets Django's test
runner create and drop its databases while jobkeeper has connections open.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate


class JobkeeperConfig(AppConfig):  # type: ignore[misc]
    name = "jobkeeper.contrib.django"
    label = "jobkeeper"
    verbose_name = "jobkeeper"

    def ready(self) -> None:
        post_migrate.connect(migrate_jobkeeper, sender=self)
        connection_created.connect(close_before_database_changes)


def migrate_jobkeeper(using: str, **kwargs: Any) -> None:
    """After Django migrated (or flushed) database ``using``: migrate
    jobkeeper's tables there for each JobkeeperBackend whose jobs live in it
    (see ``JobkeeperBackend.migrate_with_django``).
    """
    from jobkeeper.contrib.django.backend import JobkeeperBackend, task_backends

    for alias, config in getattr(settings, "TASKS", {}).items():
        if not str(config.get("BACKEND", "")).endswith(f".{JobkeeperBackend.__name__}"):
            continue
        backend = task_backends[alias]
        if isinstance(backend, JobkeeperBackend):
            version = backend.migrate_with_django(using)
            stdout = kwargs.get("stdout")
            if version is not None and stdout is not None and kwargs.get("verbosity", 1) >= 2:
                stdout.write(f"jobkeeper schema of TASKS[{alias!r}] at version {version}\n")


def close_before_database_changes(connection: Any, **kwargs: Any) -> None:
    """Django opened its connection for creating, cloning or dropping a
    database (the test runner's, ``NO_DB_ALIAS``): close jobkeeper's
    connections to Django databases first, as Django closes its own pool, or
    PostgreSQL refuses to drop or copy a database others are connected to.
    They reconnect, to whatever the database then is, when next used.
    """
    if connection.alias != NO_DB_ALIAS:
        return
    from jobkeeper.contrib.django.database import QUEUES

    QUEUES.close_followers()
