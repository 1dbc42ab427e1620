"""What the management commands share: the JobkeeperBackend a ``--backend``
names, refused as a ``CommandError`` (one line, no traceback) when it is not one.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from jobkeeper.contrib.django.backend import JobkeeperBackend, task_backends


def jobkeeper_backend(alias: str) -> JobkeeperBackend:
    """The backend of ``TASKS[alias]``.

    Raises:
        CommandError: no such alias (Django's ``InvalidTaskBackend``, an
            ``ImproperlyConfigured``), a misconfigured one, or another backend.
    """
    try:
        backend = task_backends[alias]
    except ImproperlyConfigured as exc:
        message = str(exc)
        raise CommandError(
            message if message.startswith("TASKS[") else f"--backend {alias}: {message}"
        ) from None
    if not isinstance(backend, JobkeeperBackend):
        raise CommandError(f"TASKS[{alias!r}] is {type(backend).__name__}, not JobkeeperBackend")
    return backend
