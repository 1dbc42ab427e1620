"""A SQLite backend's per-thread connection slot (internal; see
:class:`~jobkeeper.backends.sqlite.connection.SqliteConnection`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import weakref
from typing import Any

from jobkeeper.backends import forks

#: The files, as ``(st_dev, st_ino)``, whose write lock a connection this
#: process inherited over a fork held (it was inside ``BEGIN IMMEDIATE``, the
#: only transaction jobkeeper opens). SQLite keeps a process's locks in the
#: process, shared by its connections to one file: the inherited copy, which
#: must never be used or closed, holds that lock for good, and every write of
#: the child waited out busy_timeout and failed as "stayed locked".
WRITE_LOCKED_AT_FORK: set[tuple[int, int]] = set()


def note_inherited(conn: sqlite3.Connection | None, identity: tuple[int, int] | None) -> None:
    """In a forked child: note ``conn``'s file if ``conn`` held its write lock."""
    if conn is not None and identity is not None and conn.in_transaction:
        WRITE_LOCKED_AT_FORK.add(identity)


class ThreadConnection:
    """One thread's connection, and whether that thread is using it: a
    connection is closed only between its thread's calls (closing one that
    another thread was running a statement on crashed the process).

    Only its thread's locals hold it (the backend's list is weak): when the
    thread ends, or the backend is collected unclosed, it goes and closes
    its connection. Listed strongly, the connection of every thread that
    had used the queue stayed open until ``close()``: two file descriptors
    per thread (the file and its WAL), 50 threads of a pool that came and
    went left 100, and their collection at exit warned "ResourceWarning:
    unclosed database" (Python 3.13, ``-X dev``).
    """

    __slots__ = (
        "__weakref__",
        "busy_timeout",
        "conn",
        "depth",
        "doomed",
        "identity",
        "pid",
        "released",
    )

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        #: Nested backend calls of the owning thread now running.
        self.depth = 0
        #: ``close()`` came while the thread was in a call: its connection
        #: is closed when that call ends.
        self.doomed = False
        #: This thread's bound on lock waits (s), below the backend's
        #: busy_timeout (``connection_lock_wait``); None: that one.
        self.busy_timeout: float | None = None
        #: ``(st_dev, st_ino)`` of the file at the path when ``conn`` was
        #: opened: the file ``conn`` has open (see ``file_identity``).
        self.identity: tuple[int, int] | None = None
        #: The process that opened ``conn``.
        self.pid = 0
        #: Closes ``conn`` when the slot is collected in a cycle (see hold).
        self.released: weakref.finalize[Any, Any] | None = None

    def hold(self, conn: sqlite3.Connection, identity: tuple[int, int] | None) -> None:
        """Make ``conn`` this thread's connection. A slot collected in a
        reference cycle (a backend dropped unclosed) had its connection
        collected with it, finalized first or second as the collector's
        list fell: Python 3.13 warned "unclosed database" when first. The
        finalizer holds ``conn``, so it is not in the cycle, and runs before
        any ``__del__`` of it; ``__del__`` still closes it at interpreter
        exit, when finalizers no longer run.
        """
        self.conn, self.identity, self.pid = conn, identity, os.getpid()
        self.forget()
        self.released = weakref.finalize(self, release, conn, self.pid, identity)
        self.released.atexit = False

    def forget(self) -> None:
        """Drop the finalizer of the connection held (another owns it now)."""
        if self.released is not None:
            self.released.detach()
            self.released = None

    def __del__(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            release(conn, self.pid, self.identity)


def release(conn: sqlite3.Connection, pid: int, identity: tuple[int, int] | None) -> None:
    """Close a collected slot's connection, unless the process is a forked
    child: another thread's slot goes as the fork drops that thread's
    locals, before any at-fork hook runs, and its connection is the
    parent's: kept, never closed here (``forks``).
    """
    if pid != os.getpid():
        note_inherited(conn, identity)
        forks.keep(conn)
        return
    with contextlib.suppress(Exception):
        conn.close()
