"""Settings of the example shop: Django's task framework on jobkeeper.

The database comes from ``EXAMPLE_DATABASE_URL``: ``sqlite:///path.db``
(default: ``db.sqlite3`` here) or ``postgresql://user@host:port/name``, with
``EXAMPLE_SCHEMA`` naming a PostgreSQL schema to use (the tests give each run
its own). jobkeeper's tables live in the same database, so an enqueue inside
``transaction.atomic()`` commits or rolls back with the order.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "jobkeeper.contrib.django",  # manage.py jobkeeper_worker / jobkeeper_migrate
    "shop",
]
try:  # Django < 6.0: the django-tasks backport provides django.tasks' API
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")


def _database(url: str) -> dict:
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(path),
            # A file for `manage.py test`: workers cannot share Django's
            # default in-memory test database.
            "TEST": {"NAME": str(path.with_name(f"test_{path.name}"))},
        }
    parts = urlsplit(url)
    options = {}
    if os.environ.get("EXAMPLE_SCHEMA"):
        options["options"] = f"-c search_path={os.environ['EXAMPLE_SCHEMA']}"
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }


DATABASES = {
    "default": _database(
        os.environ.get("EXAMPLE_DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
    )
}

TASKS = {
    "default": {
        "BACKEND": "jobkeeper.contrib.django.backend.JobkeeperBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            # Two attempts, retried at once: quick to see in the example.
            "MAX_ATTEMPTS": 2,
            "SETTINGS": {"max_backoff": 0.01, "poll_interval": 0.2},
        },
    }
}
