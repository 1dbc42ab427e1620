"""Importing the user's app (``--app package.module:attribute``)."""

from __future__ import annotations

import importlib
import os
import sys

from jobkeeper.api import JobQueue
from jobkeeper.backends import resolve_database_url
from jobkeeper.cli.common import (
    BadInput,
)
from jobkeeper.config import DATABASE_URL_ENV


def load_app(spec: str, database_url: str | None) -> JobQueue:
    """Import the app's JobQueue, on ``database_url`` when one is given.

    ``--database`` is put in ``JOBKEEPER_DATABASE_URL`` before the import (so
    an app that uses the database at import time already uses that one), and
    the app's queue is then pointed at it in place: its tasks, and the
    follow-up jobs they enqueue, use that database too.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise BadInput(f"--app {spec!r}: expected package.module:attribute, e.g. myapp.jobs:jq")
    # `--database ''` is refused here as by every other command, not ignored.
    wanted = resolve_database_url(database_url) if database_url is not None else None
    if wanted is not None:
        os.environ[DATABASE_URL_ENV] = wanted.url
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from None
    except BaseException as exc:  # any error of the app itself (re-raised: Ctrl-C)
        # The app's own code raised while being imported (a bug at module
        # level, a SyntaxError, a sys.exit(), its own BaseException subclass):
        # one line, not a traceback. Ctrl-C stays Ctrl-C.
        if isinstance(exc, KeyboardInterrupt):
            raise
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise BadInput(f"importing app {spec!r} failed: {detail}") from None
    jq = getattr(module, attribute, None)
    if not isinstance(jq, JobQueue):
        raise BadInput(
            f"--app {spec!r}: {module_name}.{attribute} is "
            f"{type(jq).__name__ if jq is not None else 'missing'}, not a JobQueue"
        )
    if wanted is not None and jq.url.url != wanted.url:
        jq.use_database(wanted.url)
    return jq
