"""What ``connection=`` accepts: a framework's connection, unwrapped into the
DBAPI connection a backend writes on.

The backends take a psycopg 3 ``Connection`` or a ``sqlite3.Connection``.
Applications mostly hold something around one: Django's
``django.db.connection``, a SQLAlchemy ``Connection`` or ``Session`` (or, in
async code, SQLAlchemy's ``AsyncConnection`` or ``AsyncSession``). This
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

    Raises:
        django.db.transaction.TransactionManagementError: a Django connection
            inside an ``atomic()`` block that an error has already doomed
            (it will roll back): Django's own error, which any query there
            raises; nothing is written.
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
        validate = getattr(connection, "validate_no_broken_transaction", None)
        if validate is not None:
            # As every Django query does: in an atomic block an error already
            # doomed (needs_rollback), a write would be rolled back with it
            # while the enqueue reported success.
            validate()
        return connection.connection
    return connection


async def unwrap_connection_async(connection: Any) -> Any:
    """:func:`unwrap_connection` for the async API: the driver's async
    connection behind ``connection``, in the caller's transaction.

    Args:
        connection: ``None``; a psycopg 3 ``AsyncConnection`` (returned as
            is); a SQLAlchemy ``AsyncConnection`` (its transaction begun if
            none is) or ``AsyncSession`` (its connection for the default
            bind, which begins the session's transaction), on the psycopg 3
            driver (``postgresql+psycopg://``, which SQLAlchemy runs async
            under ``create_async_engine``).

    Returns:
        The connection to write on (``None`` for ``None``). Anything else,
        an ``aiosqlite`` connection behind an async SQLite engine included,
        is returned unchanged for the backend to refuse with a
        ``TypeError`` naming its type.
    """
    if connection is None:
        return None
    aio = sys.modules.get("sqlalchemy.ext.asyncio")
    if aio is None:
        return connection
    if isinstance(connection, aio.AsyncSession):
        # As Session.connection(): begins the session's transaction.
        connection = await connection.connection()
    if isinstance(connection, aio.AsyncConnection):
        if not connection.in_transaction():
            # Else the caller's commit() has nothing to commit and the pool's
            # reset rolls the job back (as for a sync Connection).
            await connection.begin()
        fairy = await connection.get_raw_connection()
        return fairy.driver_connection
    return connection
