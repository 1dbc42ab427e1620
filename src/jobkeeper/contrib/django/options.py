"""The ``OPTIONS`` of a ``TASKS`` entry that uses JobkeeperBackend (internal):
checked once, when Django makes the backend, each bad one named in full.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobkeeper import JobQueue
from jobkeeper.api import DEFAULT_MAX_ATTEMPTS
from jobkeeper.config import check_max_attempts
from jobkeeper.errors import ConfigError
from jobkeeper.tasks import suggest

#: Each option and its default.
DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "DATABASE_URL": None,
    "JOIN_TRANSACTION": True,
    "MAX_ATTEMPTS": DEFAULT_MAX_ATTEMPTS,
    "MIGRATE": True,
    "SETTINGS": {},
}
#: What ``SETTINGS`` may hold: JobQueue's keyword arguments.
QUEUE_SETTINGS = frozenset(
    name
    for name, parameter in inspect.signature(JobQueue.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
)


def checked_options(alias: str, options: Any) -> dict[str, Any]:
    """``TASKS[alias]["OPTIONS"]`` with every option present (defaults
    filled in) and of the right type. The values of ``SETTINGS`` are
    JobQueue's to check.

    Raises:
        ImproperlyConfigured: naming the option and its value.
    """
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict, got {type(options).__name__}")
    for name in options:
        if name not in DEFAULTS:
            raise ImproperlyConfigured(
                f"{where} has an unknown option {name!r}{suggest(str(name), DEFAULTS)}; "
                f"valid options: {', '.join(DEFAULTS)}"
            )
    checked = {**DEFAULTS, **options}

    def refuse(name: str, wanted: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"{where}[{name!r}] must be {wanted}, got {checked[name]!r}")

    database = checked["DATABASE"]
    if not isinstance(database, str) or database not in settings.DATABASES:
        aliases = ", ".join(map(repr, settings.DATABASES))
        raise refuse("DATABASE", f"an alias of DATABASES ({aliases})")
    url = checked["DATABASE_URL"]
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise refuse("DATABASE_URL", "a jobkeeper database URL or None")
    for name in ("JOIN_TRANSACTION", "MIGRATE"):
        if not isinstance(checked[name], bool):
            raise refuse(name, "True or False")
    try:
        check_max_attempts(checked["MAX_ATTEMPTS"])
    except ConfigError:
        raise refuse("MAX_ATTEMPTS", "an int between 1 and 1000000") from None
    job_settings = checked["SETTINGS"]
    if not isinstance(job_settings, Mapping):
        raise refuse("SETTINGS", "a dict of JobQueue keyword arguments")
    for name in job_settings:
        if name not in QUEUE_SETTINGS:
            raise ImproperlyConfigured(
                f"{where}['SETTINGS'] has {name!r}, which is not a JobQueue keyword argument"
                f"{suggest(str(name), QUEUE_SETTINGS)}; valid: {', '.join(sorted(QUEUE_SETTINGS))}"
            )
    checked["SETTINGS"] = dict(job_settings)
    return checked
