"""What ``connection=`` accepts: a framework's connection, unwrapped into the
DBAPI connection a backend writes on.

The backends take a psycopg 3 ``Connection`` or a ``sqlite3.Connection``.
Applications mostly hold something around one: Django's
``django.db.connection``, a SQLAlchemy ``Connection`` or ``Session``. This
module finds the DBAPI connection inside, with the framework's transaction
open on it, so that an enqueue joins the caller's transaction instead of
starting one of its own. Frameworks are recognised only when the application
has already imported them (``sys.modules``): nothing here imports Django or
SQLAlchemy.

Leaf module: imports nothing from jobkeeper.
"""

from __future__ import annotations

import sys
from typing import Any


def unwrap_connection(connection: Any) -> Any:
    """The DBAPI connection behind ``connection``, in the caller's transaction.

    Args:
        connection: ``None``; a psycopg 3 ``Connection`` or ``sqlite3.Connection``
            (returned as is); Django's ``django.db.connection`` or
            ``django.db.connections[alias]`` (connected first if it was not);
            a SQLAlchemy ``Connection`` (its transaction begun if none is, so
            the job commits with the caller's ``commit()``) or ``Session``
            (its connection for the default bind, which begins the session's
            transaction).

    Returns:
        The connection to write on (``None`` for ``None``). Anything else is
        returned unchanged, for the backend to accept or refuse with a
        ``TypeError`` naming its type.
    """
    if connection is None:
        return None
    orm = sys.modules.get("sqlalchemy.orm")
    if orm is not None and isinstance(connection, orm.Session):
        # Session.connection() begins the session's transaction (SQLAlchemy
        # 2 "autobegin") and returns the Connection it runs on.
        connection = connection.connection()
    engine = sys.modules.get("sqlalchemy.engine")
    if engine is not None and isinstance(connection, engine.Connection):
        if not connection.in_transaction():
            # Without a begun transaction, the caller's commit() would have
            # nothing to commit and the pool's reset would roll the job back.
            connection.begin()
        return connection.connection.dbapi_connection
    if hasattr(connection, "ensure_connection") and hasattr(connection, "in_atomic_block"):
        # Django: a DatabaseWrapper (also a third-party one), or the
        # ConnectionProxy that django.db.connection is, which forwards to the
        # alias's wrapper; `.connection` is the DBAPI connection (None until
        # first use).
        connection.ensure_connection()
        return connection.connection
    return connection
