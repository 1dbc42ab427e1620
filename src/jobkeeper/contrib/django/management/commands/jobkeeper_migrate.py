"""``manage.py jobkeeper_migrate``: create or upgrade jobkeeper's tables."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobkeeper.contrib.django.backend import JobkeeperBackend

try:  # Django >= 6.0
    from django.tasks import task_backends
except ImportError:  # the django-tasks backport
    from django_tasks import task_backends


class Command(BaseCommand):  # type: ignore[misc]
    help = "Create or upgrade jobkeeper's tables for a Django task backend (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias.")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = task_backends[options["backend"]]
        if not isinstance(backend, JobkeeperBackend):
            raise CommandError(
                f"TASKS[{options['backend']!r}] is {type(backend).__name__}, not JobkeeperBackend"
            )
        version = backend.queue.migrate()
        self.stdout.write(f"jobkeeper schema at version {version}")
