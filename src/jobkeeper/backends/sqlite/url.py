"""Parsing ``sqlite:///`` URLs (internal)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from jobkeeper.database_url import DatabaseURL, redact_secrets
from jobkeeper.errors import ConfigError


def parse_url(url: str) -> DatabaseURL:
    """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``.

    Raises:
        ConfigError: no file is named, or the name is an in-memory or URI
            database, which other connections and processes cannot share.
    """
    rest = url.partition("://")[2]
    path, _, query = rest.partition("?")
    if not path.startswith("/") or len(path) < 2:
        raise ConfigError(
            f"invalid SQLite URL {redact_secrets(url)!r}: expected sqlite:///relative.db or sqlite:////abs/path.db"
        )
    path = path[1:]
    if path.endswith("/"):
        raise ConfigError(
            f"invalid SQLite URL {redact_secrets(url)!r}: the path names a directory, not a file"
        )
    if path in (":memory:", "") or path.startswith("file:"):
        raise ConfigError(
            f"invalid SQLite URL {redact_secrets(url)!r}: jobkeeper needs a database file that "
            "several connections and processes can share"
        )
    return DatabaseURL("sqlite", url, path=path, options=dict(parse_qsl(query)))
