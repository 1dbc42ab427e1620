"""What a forked child does with the connections and locks jobkeeper had
open in its parent (internal): it never uses, closes or finalizes them, and
opens its own on first use.

A child made by ``os.fork()`` (multiprocessing's ``fork`` start method,
gunicorn ``--preload``, a task that forks) gets a copy of every object of
its parent. A PostgreSQL connection's copy shares the parent's socket: the
child's statements interleaved with the parent's on one session (the
parent and two children of three failed at once, "server closed the
connection unexpectedly"), and a close or a finalizer in the child sends a
Terminate that ends the parent's session. A SQLite connection's copy
carries the parent's lock state: used in the child it can corrupt the file
(sqlite.org/howtocorrupt.html, 2.6). A lock another thread of the parent
held at the fork stays held in the child for good.

So, in the child, as soon as the fork returns (``os.register_at_fork``):

- the socket of every psycopg connection noted here (:func:`note`) is
  replaced by ``/dev/null`` (``dup2``): nothing is sent on it, the parent's
  socket stays open in the parent, and whatever the child's copy still
  writes (a finalizer's Terminate) goes nowhere; a read finds end of file;
- every owner noted here (:func:`watch`) drops what it holds (its pools,
  connections, locks) and makes new ones on its first use in the child;
- what they dropped is kept (:func:`keep`) and never finalized: a pool's
  finalizer takes locks a thread of the parent may have held, and a sqlite3
  connection's close may checkpoint with its parent's lock state.

Nothing of this runs outside a fork: an API call pays nothing for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from typing import Any, Protocol

logger = logging.getLogger("jobkeeper")


class ForkAware(Protocol):
    def drop_inherited(self) -> None:
        """In a forked child: let go of what the parent opened (see :func:`keep`)."""
        ...


#: The psycopg connections (sync and async) jobkeeper opened in this process.
_connections: weakref.WeakSet[Any] = weakref.WeakSet()
_owners: weakref.WeakSet[Any] = weakref.WeakSet()
#: What a child inherited and must never finalize (see _leak_kept).
_kept: list[object] = []


def note(conn: Any) -> None:
    """A psycopg connection just opened by jobkeeper: made unusable in a forked child."""
    _connections.add(conn)


def watch(owner: ForkAware) -> None:
    """Call ``owner.drop_inherited()`` in every child forked from now on."""
    _owners.add(owner)


def keep(*objects: object) -> None:
    """Hold ``objects`` (inherited, dropped) until the process ends, unfinalized."""
    _kept.extend(obj for obj in objects if obj is not None)


def _leak_kept() -> None:
    """Give ``_kept`` one reference nothing releases: at interpreter exit
    module globals are cleared, and a list they alone held would finalize
    what it keeps, in the child (a psycopg pool's ``__del__`` takes its
    scheduler's lock, which may have been held at the fork).
    """
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_kept))


_leaked = False


def _blind(conn: Any, devnull: int) -> None:
    """Put ``/dev/null`` where ``conn``'s socket was, in this process only."""
    try:
        fd = conn.pgconn.socket
    except Exception:  # noqa: BLE001 - closed: no socket left to share
        return
    if fd >= 0:
        os.dup2(devnull, fd)


def _after_fork_in_child() -> None:
    global _leaked
    connections = list(_connections)
    _connections.clear()
    if connections:
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            for conn in connections:
                try:
                    _blind(conn, devnull)
                except OSError as exc:  # an fd limit: say so, the rest still go
                    logger.warning("fork: could not detach a PostgreSQL connection (%s)", exc)
        finally:
            os.close(devnull)
        keep(*connections)
    for owner in list(_owners):
        try:
            owner.drop_inherited()
        except Exception:  # a hook must not fail the fork
            logger.exception("fork: %r could not drop what it inherited", owner)
    if _kept and not _leaked:
        _leaked = True
        _leak_kept()


os.register_at_fork(after_in_child=_after_fork_in_child)
