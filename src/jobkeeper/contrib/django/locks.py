"""SQLite's one writer and this thread's Django connection (internal).

SQLite lets one connection write to a file at a time, and a connection that
has written in a transaction keeps that write lock until the transaction
ends. When this thread's Django connection to the jobs' SQLite file has such
a transaction open (``transaction.set_autocommit(False)`` then a write, or
an ``atomic()`` block while ``JOIN_TRANSACTION`` is off), an enqueue on
jobkeeper's own connection waits for a lock that only this same thread can
release: it would wait out ``busy_timeout`` and fail. :func:`own_write`
makes that a quick, named error instead.

Whether the transaction has written is not something SQLite tells another
connection: Python's sqlite3 begins a transaction outside ``atomic()`` only
before a write, so one open there has written, and Django's ``IMMEDIATE``
or ``EXCLUSIVE`` transaction mode takes the lock at ``BEGIN``; a plain
``atomic()`` begins at once, written or not. In that last case the enqueue
waits briefly (the lock may be another process's, taken for a moment) and
only then gives up, so an atomic block that has only read still enqueues.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import connections
from django.db.transaction import TransactionManagementError

from jobkeeper import JobQueue
from jobkeeper.contrib.django.database import is_in_memory
from jobkeeper.errors import DatabaseUnavailable

#: Seconds an enqueue waits for the write lock when this thread's Django
#: transaction may hold it (a plain atomic(), written or not): a lock taken
#: by another process for a commit is let go well within it.
MAY_HOLD_WAIT = 1.0


def holder(queue: JobQueue) -> tuple[Any, bool] | None:
    """This thread's Django connection that has a transaction open on the
    SQLite file of ``queue``, and whether it surely holds the write lock;
    None: there is none (or ``queue`` is not on SQLite).
    """
    if queue.url.scheme != "sqlite":
        return None
    path = Path(queue.url.path).resolve()
    for connection in connections.all(initialized_only=True):
        raw = connection.connection
        if connection.vendor != "sqlite" or raw is None or not raw.in_transaction:
            continue
        name = str(connection.settings_dict.get("NAME") or "")
        if is_in_memory(name) or Path(name).resolve() != path:
            continue
        surely = not connection.in_atomic_block or getattr(
            connection, "transaction_mode", None
        ) in ("IMMEDIATE", "EXCLUSIVE")
        return connection, surely
    return None


@contextlib.contextmanager
def own_write(queue: JobQueue) -> Iterator[None]:
    """Around a write on jobkeeper's own connection to ``queue``: when this
    thread's Django connection may hold the SQLite file's write lock, the
    write waits for it at most :data:`MAY_HOLD_WAIT` (not at all when the
    Django transaction surely holds it) instead of ``busy_timeout``.

    Raises:
        TransactionManagementError: the lock stayed taken while this
            thread's Django transaction on the file was open; nothing was
            written. Says what to do: join that transaction, or end it first.
    """
    held = holder(queue)
    if held is None:
        yield
        return
    connection, surely = held
    backend = queue.backend
    backend.connection_lock_wait(seconds=0.0 if surely else MAY_HOLD_WAIT)
    try:
        yield
    except DatabaseUnavailable as exc:
        if "locked" not in str(exc):
            raise
        holds = "holds" if surely else f"may hold (it stayed taken for {MAY_HOLD_WAIT:g}s)"
        path = Path(queue.url.path).resolve()
        raise TransactionManagementError(
            f"jobkeeper cannot write the job on its own connection: this thread's Django "
            f"connection {connection.alias!r} has a transaction open on the same SQLite file "
            f"({path}) that {holds} its write lock, which SQLite gives one "
            "connection at a time and which stays taken until that transaction ends. "
            "Enqueue inside transaction.atomic() with OPTIONS['JOIN_TRANSACTION'] on (the "
            "job then commits with it), or commit or roll back the transaction first; "
            "nothing was written"
        ) from exc
    finally:
        backend.connection_lock_wait(seconds=None)
