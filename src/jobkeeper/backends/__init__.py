"""Database backends behind one Protocol (:mod:`jobkeeper.backends.base`).

Internal: users pick a backend by URL through :class:`jobkeeper.JobQueue`.
"""

from __future__ import annotations

from jobkeeper.backends.base import Backend
from jobkeeper.config import DatabaseURL, Settings


def open_backend(url: DatabaseURL, settings: Settings) -> Backend:
    """Create the backend for ``url`` (no connection is made yet)."""
    if url.scheme == "sqlite":
        from jobkeeper.backends.sqlite.backend import SqliteBackend

        return SqliteBackend(url, busy_timeout=settings.busy_timeout)
    from jobkeeper.backends.postgres.backend import PostgresBackend

    return PostgresBackend(url, pool_size=settings.pool_size)


__all__ = ["Backend", "open_backend"]
