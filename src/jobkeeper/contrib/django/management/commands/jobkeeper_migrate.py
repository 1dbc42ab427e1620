"""``manage.py jobkeeper_migrate``: create or upgrade jobkeeper's tables."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobkeeper.contrib.django.management.commands._backend import jobkeeper_backend
from jobkeeper.errors import JobkeeperError


class Command(BaseCommand):  # type: ignore[misc]
    help = "Create or upgrade jobkeeper's tables for a Django task backend (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias.")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = jobkeeper_backend(options["backend"])
        try:
            version = backend.queue.migrate()
        except JobkeeperError as exc:  # the database down, a role without rights
            raise CommandError(str(exc)) from None
        self.stdout.write(f"jobkeeper schema at version {version}")
