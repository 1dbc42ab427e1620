"""Database backends behind one Protocol (:mod:`jobkeeper.backends.base`).

Internal: users pick a backend by URL through :class:`jobkeeper.JobQueue`.
A backend is one entry of ``BACKENDS``: the URL schemes it serves, the
function that checks its URLs, and the one that opens it. A third backend
is a third entry.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from jobkeeper.backends.base import Backend
from jobkeeper.config import Settings
from jobkeeper.database_url import (
    DATABASE_URL_ENV,
    DatabaseURL,
    redact_secrets,
    requested_database_url,
)
from jobkeeper.errors import ConfigError


def _open_sqlite(url: DatabaseURL, settings: Settings) -> Backend:
    from jobkeeper.backends.sqlite.backend import SqliteBackend

    return SqliteBackend(url, busy_timeout=settings.busy_timeout)


def _open_postgres(url: DatabaseURL, settings: Settings) -> Backend:
    try:
        from jobkeeper.backends.postgres.backend import PostgresBackend
    except ModuleNotFoundError as exc:
        # psycopg is the `postgres` extra: the SQLite default installs without it.
        if exc.name not in ("psycopg", "psycopg_pool"):
            raise
        raise ConfigError(
            f"{url.redacted()}: PostgreSQL needs psycopg 3, which is not installed: "
            "pip install 'jobkeeper[postgres]'"
        ) from None

    return PostgresBackend(url, pool_size=settings.pool_size)


def _parse_sqlite(url: str) -> DatabaseURL:
    from jobkeeper.backends.sqlite.url import parse_url

    return parse_url(url)


def _parse_postgres(url: str) -> DatabaseURL:
    from jobkeeper.backends.postgres.url import parse_url

    return parse_url(url)


@dataclasses.dataclass(frozen=True, slots=True)
class BackendEntry:
    """How to check a backend's URLs and open it (the imports are lazy, so
    the SQLite default loads no PostgreSQL driver).
    """

    parse: Callable[[str], DatabaseURL]
    open: Callable[[DatabaseURL, Settings], Backend]
    #: Its ``job_insert_many`` takes a :class:`~jobkeeper.models.NewJobStream`
    #: and writes rows while it validates them; otherwise the API hands it
    #: a list, validated whole before the backend is opened.
    streams_inserts: bool = False


#: URL scheme -> backend.
BACKENDS: dict[str, BackendEntry] = {
    "sqlite": BackendEntry(_parse_sqlite, _open_sqlite),
    "postgresql": BackendEntry(_parse_postgres, _open_postgres, streams_inserts=True),
    "postgres": BackendEntry(_parse_postgres, _open_postgres, streams_inserts=True),
}
#: Schemes users ask for that no backend serves yet.
PLANNED = ("mysql", "mariadb")


def resolve_database_url(url: str | None) -> DatabaseURL:
    """Pick and parse the database URL: the argument, else
    ``JOBKEEPER_DATABASE_URL``, else ``sqlite:///jobkeeper.db``.

    Accepted forms: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``,
    ``postgresql://user@host:port/db`` (also ``postgres://``).

    Raises:
        ConfigError: the URL is not a string, has an unknown scheme, or is
            not valid for its backend (the message says why, and ends
            "(from $JOBKEEPER_DATABASE_URL)" when that is where it came from).
    """
    if url is None and os.environ.get(DATABASE_URL_ENV):
        # The caller gave no URL, so it may not know the environment named
        # one: "invalid database URL 'bogus'" left people searching their code.
        try:
            return _parse_requested(requested_database_url(None))
        except ConfigError as exc:
            raise ConfigError(f"{exc} (from ${DATABASE_URL_ENV})") from None
    return _parse_requested(requested_database_url(url))


def _parse_requested(url: str) -> DatabaseURL:
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ConfigError(
            f"invalid database URL {redact_secrets(url)!r}: expected sqlite:///path.db or postgresql://user@host/db"
        )
    entry = BACKENDS.get(scheme)
    if entry is not None:
        return entry.parse(url)
    if scheme in PLANNED:
        raise ConfigError(f"{scheme}:// is not supported yet; use sqlite:/// or postgresql://")
    raise ConfigError(
        f"invalid database URL {redact_secrets(url)!r}: unknown scheme {scheme!r}"
        " (use sqlite or postgresql)"
    )


def open_backend(url: DatabaseURL, settings: Settings) -> Backend:
    """Create the backend for ``url`` (no connection is made yet)."""
    return BACKENDS[url.scheme].open(url, settings)


__all__ = ["BACKENDS", "Backend", "open_backend", "resolve_database_url"]
