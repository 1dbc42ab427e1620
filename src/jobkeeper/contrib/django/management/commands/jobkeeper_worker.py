"""``manage.py jobkeeper_worker``: run a jobkeeper worker for a Django task backend."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobkeeper.contrib.django.backend import JobkeeperBackend

try:  # Django >= 6.0
    from django.tasks import task_backends
except ImportError:  # the django-tasks backport
    from django_tasks import task_backends


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Run a jobkeeper worker for the tasks of a Django task backend "
        "(SIGTERM/SIGINT: a graceful stop)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias.")
        parser.add_argument(
            "--queue",
            "-q",
            action="append",
            dest="queues",
            help="Queue to work; repeat for several. Default: the backend's QUEUES.",
        )
        parser.add_argument("--concurrency", type=int, default=10, help="Jobs at once.")
        parser.add_argument(
            "--burst", action="store_true", help="Exit once nothing is available or due soon."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = task_backends[options["backend"]]
        if not isinstance(backend, JobkeeperBackend):
            raise CommandError(
                f"TASKS[{options['backend']!r}] is {type(backend).__name__}, not JobkeeperBackend"
            )
        queues = options["queues"] or sorted(backend.queues) or ["default"]
        code = backend.queue.run_worker(
            queues=queues, concurrency=options["concurrency"], burst=options["burst"]
        )
        if code:
            raise SystemExit(code)
