"""``manage.py jobkeeper_worker``: run a jobkeeper worker for a Django task backend."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobkeeper.config import check_name
from jobkeeper.contrib.django.management.commands._backend import jobkeeper_backend
from jobkeeper.errors import ConfigError, JobkeeperError


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
        alias = options["backend"]
        backend = jobkeeper_backend(alias)
        queues = options["queues"] or sorted(backend.queues)
        if not queues:
            # Django takes an empty QUEUES as "any queue_name": no list to
            # serve, and a default one would leave other queues' jobs waiting.
            raise CommandError(
                f"TASKS[{alias!r}]['QUEUES'] is empty, so tasks may use any queue_name: "
                "name the queues to work with --queue (repeat for several)"
            )
        try:
            for queue in queues:
                check_name("queue", queue)
        except ConfigError as exc:
            where = "--queue" if options["queues"] else f"TASKS[{alias!r}]['QUEUES']"
            raise CommandError(f"{where}: {exc}") from None
        if options["concurrency"] < 1:
            raise CommandError(f"--concurrency must be at least 1, got {options['concurrency']}")
        try:
            code = backend.queue.run_worker(
                queues=queues, concurrency=options["concurrency"], burst=options["burst"]
            )
        except JobkeeperError as exc:  # the database down at the start, a bad setting
            raise CommandError(str(exc)) from None
        if code:
            raise SystemExit(code)
