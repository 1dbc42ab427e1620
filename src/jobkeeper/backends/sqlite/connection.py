"""SQLite connections (internal): one per thread, WAL, a busy timeout,
``BEGIN IMMEDIATE`` writes retried while the database is locked, and the
translation of driver errors into jobkeeper's.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from jobkeeper.backends import forks
from jobkeeper.backends.rows import epoch_to_datetime, job_from_row
from jobkeeper.backends.sqlite.files import (
    file_identity,
    is_empty_file,
    leftovers_refusal,
    not_writable_hint,
)
from jobkeeper.backends.sqlite.queries import QUERIES
from jobkeeper.backends.sqlite.slots import (
    WRITE_LOCKED_AT_FORK,
    ThreadConnection,
    note_inherited,
)
from jobkeeper.database_url import DatabaseURL
from jobkeeper.errors import (
    DatabaseError,
    DatabaseReplaced,
    DatabaseUnavailable,
    DataRejected,
    UniqueKeyConflict,
)
from jobkeeper.models import Job


def _rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    if cursor.description is None:
        return []
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    message = str(exc).lower()
    return "locked" in message or "busy" in message


#: OperationalError texts of conditions that pass (trying later is the remedy).
_PASSING_CONDITIONS = ("disk is full", "readonly", "disk i/o error", "unable to open")


T = TypeVar("T")

#: Milliseconds SQLite's busy handler may wait in one attempt at the write
#: lock. Its handler sleeps ever longer, 100 ms at a time after 0.3 s, so a
#: writer that had waited long looked for the lock ten times a second while
#: newcomers took it at each release: behind 2 s holds an enqueue waited past
#: a 5 s busy_timeout (C-13). Attempts of one slice, repeated until
#: busy_timeout, keep a long waiter looking as often as a new one. Within a
#: slice the handler sleeps 1, 2, 5, 10 ms...: a slice of 5 ms keeps every
#: look at most 2 ms from the last, so a write waiting behind a commit gets
#: the lock about 1 ms after its release (25 ms slices: 2.7 ms, 9 ms at p90).
BUSY_SLICE_MS = 5


def _retry_while_locked(action: Callable[[], T], timeout: float, max_pause: float = 0.25) -> T:
    """Run ``action`` and return its result, retrying with jittered backoff
    (at most ``max_pause`` seconds) while SQLite reports the database locked,
    for up to ``timeout`` seconds.

    For what the busy timeout does not cover: switching a new file to WAL
    needs an exclusive lock, and connections opened at the same moment (four
    processes running ``migrate`` at once) get "database is locked" at once.
    """
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(min(pause, max_pause) * (0.5 + random.random()))
            pause = min(pause * 2, max_pause)


class SqliteConnection:
    """Where a SQLite backend's statements run: this thread's connection,
    with driver errors translated (the base of every part of the backend).

    Args:
        url: the parsed ``sqlite:///`` URL.
        busy_timeout: seconds a write waits for the lock before failing with
            :class:`~jobkeeper.errors.DatabaseUnavailable`.
    """

    def __init__(
        self, url: DatabaseURL, *, busy_timeout: float = 30.0, pinned: bool = False
    ) -> None:
        self.url = url
        self.path = os.path.abspath(url.path)
        self.busy_timeout = busy_timeout
        #: A pinned backend (a worker's, see ``dedicated``) stays on the file
        #: at the path when it was made (else the one its first connection
        #: opened): a connection opened on another file (the path's file
        #: replaced) fails with DatabaseReplaced. Taken here, not at each
        #: backend's first connection: a worker makes all of its backends
        #: before it opens any, and they opened theirs at different times, so
        #: one opened after a replace served the new file while the others
        #: served the old. An unpinned one (the API's) opens whatever file is
        #: at the path then.
        self.pinned = pinned
        self._pin = file_identity(self.path) if pinned else None
        self._local = threading.local()
        # Weak: see ThreadConnection.
        self._threads: weakref.WeakSet[ThreadConnection] = weakref.WeakSet()
        self._threads_lock = threading.Lock()
        forks.watch(self)

    def drop_inherited(self) -> None:
        """In a forked child: every thread's connection is the parent's,
        whose lock state the child does not have (used here, it can corrupt
        the file). Kept unclosed (``forks``); each thread of the child opens
        its own on its next call.
        """
        self._threads_lock = threading.Lock()
        for slot in list(self._threads):
            note_inherited(slot.conn, slot.identity)
            forks.keep(slot.conn)
            slot.forget()
            slot.conn, slot.depth, slot.doomed, slot.identity = None, 0, False, None
        self._threads = weakref.WeakSet()

    # -- plumbing -----------------------------------------------------------

    def _thread(self) -> ThreadConnection:
        """This thread's slot (made on its first call)."""
        slot: ThreadConnection | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = ThreadConnection()
        return slot

    def _conn(self, *, create: bool = False) -> sqlite3.Connection:
        """This thread's connection (only inside :meth:`_errors`, which marks
        it in use). Only ``migrate`` may create the file: anything else on a
        missing file would leave an empty database behind and then fail
        anyway.
        """
        slot = self._thread()
        conn = slot.conn
        if conn is None:
            if self.pinned and self._pin is not None and not os.path.exists(self.path):
                # A worker's file (or its directory) was removed: no migrate
                # mends that for it, and it stops on this error.
                raise DatabaseReplaced(
                    f"SQLite database {self.path!r} was removed since this worker opened it; "
                    "nothing was written",
                    path=self.path,
                )
            directory = os.path.dirname(self.path)
            if directory and not os.path.isdir(directory):
                # Not an outage (waited on, a worker never said what was
                # wrong): every command says the same, migrate included.
                then = "" if create else f", then {self.url.migrate_hint()}"
                raise DatabaseError(
                    f"SQLite database {self.path!r}: directory {directory!r} does not exist "
                    f"-- create it{then}, or fix the URL"
                )
            if not create and not os.path.exists(self.path):
                raise DatabaseError(
                    f"SQLite database {self.path!r} does not exist -- "
                    f"{self.url.migrate_hint()} first"
                )
            if os.path.isdir(self.path):
                raise DatabaseError(
                    f"SQLite: {self.path!r} is a directory, not a database file; check the URL"
                )
            if not create and is_empty_file(self.path):
                # SQLite would take it for an empty database and make it one
                # (WAL mode, a header): a command that only reads must not.
                raise DatabaseError(
                    f"SQLite database {self.path!r} is empty (0 bytes) -- "
                    f"{self.url.migrate_hint()} first; the file was left as it is"
                )
            if create and (not os.path.exists(self.path) or is_empty_file(self.path)):
                refusal = leftovers_refusal(self.path)
                if refusal:
                    raise DatabaseError(refusal)
            before = file_identity(self.path)
            conn = None
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self._busy_timeout(),
                    isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                    check_same_thread=False,
                )
                _retry_while_locked(
                    lambda: conn.execute(QUERIES["connection_journal_wal"]), self._busy_timeout()
                )
                conn.execute(QUERIES["connection_synchronous_full"])
                conn.execute(QUERIES["connection_journal_size_limit"])
            except sqlite3.Error as exc:
                if conn is not None:
                    conn.close()
                code = getattr(exc, "sqlite_errorcode", None)
                if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
                    # Not a passing condition: waiting will not make the file
                    # a database, so it is not DatabaseUnavailable (retried).
                    what = "not a SQLite database" if code == sqlite3.SQLITE_NOTADB else "damaged"
                    raise DatabaseError(
                        f"SQLite: {self.path!r} is {what} ({exc}); check the URL -- the "
                        "file was left as it is"
                    ) from exc
                raise DatabaseUnavailable(
                    f"SQLite database {self.path!r}: {exc}{not_writable_hint(self.path)}"
                ) from exc
            identity = self._opened_identity(conn, before)
            with self._threads_lock:
                slot.hold(conn, identity)
                # Listed while it has a connection: close() goes through the list.
                self._threads.add(slot)
        return conn

    def _opened_identity(
        self, conn: sqlite3.Connection, before: tuple[int, int] | None
    ) -> tuple[int, int]:
        """The identity of the file ``conn`` just opened (its path's, read
        before and after the open: they must agree, or the file was swapped
        meanwhile), checked against the pin; ``conn`` is closed on a refusal.

        Raises:
            DatabaseReplaced: the file went or changed while being opened, or
                a pinned backend's path now holds another file.
        """
        identity = file_identity(self.path)
        problem = ""
        if identity is None:
            problem = "was removed while it was being opened"
        elif before is not None and identity != before:
            problem = "was replaced while it was being opened"
        elif self.pinned and self._pin is not None and identity != self._pin:
            problem = (
                "is not the file this worker started on: it was removed or replaced since "
                "(restart the worker to use the new file)"
            )
        if problem or identity is None:
            conn.close()
            raise DatabaseReplaced(
                f"SQLite database {self.path!r} {problem}; nothing was written", path=self.path
            )
        if self.pinned and self._pin is None:
            self._pin = identity
        return identity

    def _check_file(self, *, committed: bool = False) -> None:
        """Raise unless this thread's connection still has the file at the
        path open (one ``stat``); the connection is then closed as its call
        ends, so an unpinned backend's next call opens the path afresh.

        Args:
            committed: the check follows a commit (the message says that the
                commit went to the removed file).

        Raises:
            DatabaseReplaced: the file was removed (nothing at the path, or
                its directory gone) or replaced by another file.
        """
        slot = self._thread()
        if slot.identity is None:
            return
        now = file_identity(self.path)
        if now == slot.identity:
            return
        with self._threads_lock:
            slot.doomed = True
        what = "was removed" if now is None else "was replaced by another file"
        if committed:
            done = (
                "the write just committed went to the removed file: it is not in the "
                "file at the path, so it is not stored"
            )
        else:
            done = "nothing was written (it would have gone to the deleted file)"
        raise DatabaseReplaced(
            f"SQLite database {self.path!r} {what} while this process had it open; {done}",
            path=self.path,
        )

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Translate driver errors; the thread's connection is in use inside."""
        slot = self._thread()
        with self._threads_lock:
            slot.depth += 1
        try:
            yield
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise DatabaseUnavailable(
                    f"SQLite database {self.path!r} stayed locked for more than "
                    f"busy_timeout={self._busy_timeout()}s; nothing was written",
                    unreachable=False,
                ) from exc
            # A table or column a newer schema version adds: not migrated yet.
            if any(m in str(exc) for m in ("no such table", "no such column", "has no column")):
                raise DatabaseError(f"SQLite: {exc} -- {self.url.migrate_hint()} first") from exc
            if any(word in str(exc).lower() for word in _PASSING_CONDITIONS):
                hint = not_writable_hint(self.path) if "readonly" in str(exc) else ""
                raise DatabaseUnavailable(
                    f"SQLite database {self.path!r}: {exc}{hint}",
                    # A full disk: the file answered, and what passes is no outage.
                    unreachable="disk is full" not in str(exc).lower(),
                ) from exc
            raise DatabaseError(f"SQLite error: {exc}") from exc
        except sqlite3.IntegrityError as exc:
            if "unique_key" in str(exc):
                raise UniqueKeyConflict(f"SQLite refused the data: {exc}") from exc
            raise DataRejected(f"SQLite refused the data: {exc}") from exc
        except sqlite3.DataError as exc:
            raise DataRejected(f"SQLite refused the data: {exc}") from exc
        except sqlite3.Error as exc:
            raise DatabaseError(f"SQLite error: {exc}") from exc
        finally:
            closing = None
            with self._threads_lock:
                slot.depth -= 1
                if slot.depth == 0 and slot.conn is not None and slot.conn.in_transaction:
                    # Left open by an interrupted call (a second Ctrl-C in its
                    # ROLLBACK): closed, it lets go of the write lock.
                    slot.doomed = True
                if slot.depth == 0 and slot.doomed:
                    closing, slot.conn, slot.doomed = slot.conn, None, False
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing.close()

    @contextlib.contextmanager
    def _write(
        self, *, create: bool = False, synced: bool = True, lock_wait: float | None = None
    ) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction, retried while the lock is busy
        (for up to ``lock_wait`` seconds; None: ``busy_timeout``).

        The connection's busy timeout already waits for the lock; the loop
        adds jittered retries for the cases SQLite reports BUSY at once, up
        to the same deadline (huey#445, solid_queue#309).

        ``synced=False``: the commit returns before the WAL is fsynced
        (``synchronous=NORMAL`` for this transaction). Only for a write whose
        loss is harmless: a process crash loses nothing either way (the
        frames are in the file); only a power loss or an OS crash can, and
        that stops every worker on this machine too. The next synced commit
        on the file fsyncs these frames with its own, so no later write is
        ever durable without this one.
        """
        with self._errors():
            conn = self._conn(create=create)
            if not synced:
                conn.execute(QUERIES["connection_synchronous_normal"])
            try:
                # The BEGIN inside: a Ctrl-C as it returns left the connection
                # in a write transaction nobody would end, every later call
                # failing and every other process's writes waiting on it.
                try:
                    self._begin_immediate(conn, lock_wait)
                    yield conn
                    # Before the commit: a file removed or replaced is
                    # refused with nothing written. After it too: one removed
                    # between the check and the commit took the commit with
                    # it, so the write is not claimed as done. The open
                    # connection keeps the old inode allocated, so its number
                    # cannot come back on a new file meanwhile.
                    self._check_file()
                    conn.execute("COMMIT")
                    self._check_file(committed=True)
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            finally:
                if not synced:
                    conn.execute(QUERIES["connection_synchronous_full"])

    def _begin_immediate(self, conn: sqlite3.Connection, lock_wait: float | None = None) -> None:
        """``BEGIN IMMEDIATE``: see :meth:`_take_write_lock`."""
        self._take_write_lock(conn, lambda: conn.execute("BEGIN IMMEDIATE"), lock_wait)

    def _take_write_lock(
        self, conn: sqlite3.Connection, action: Callable[[], T], lock_wait: float | None = None
    ) -> T:
        """Run ``action`` (a statement that takes the write lock), waiting up
        to ``lock_wait`` (None: ``busy_timeout``) for the lock in attempts of
        ``BUSY_SLICE_MS`` (see there); every other statement keeps the full
        busy timeout.
        """
        if WRITE_LOCKED_AT_FORK and self._thread().identity in WRITE_LOCKED_AT_FORK:
            raise DatabaseError(
                f"SQLite database {self.path!r}: this process was forked while a thread of its "
                "parent was writing to it, and SQLite keeps that write lock in this process for "
                "good (its copy of the parent's connection holds it, and must not be used or "
                "closed here); nothing was written. Fork while no thread writes, or start the "
                "process with the spawn or forkserver method"
            )
        busy = QUERIES["connection_busy_timeout"]
        conn.execute(busy.replace("{ms}", str(BUSY_SLICE_MS)))
        try:
            timeout = self._busy_timeout() if lock_wait is None else lock_wait
            return _retry_while_locked(action, timeout, 0.0)
        finally:
            conn.execute(busy.replace("{ms}", str(int(self._busy_timeout() * 1000))))

    def _busy_timeout(self) -> float:
        """Seconds this thread's statements wait for the write lock."""
        bound = self._thread().busy_timeout
        return self.busy_timeout if bound is None else min(bound, self.busy_timeout)

    def connection_lock_wait(self, *, seconds: float | None) -> None:
        slot = self._thread()
        if slot.busy_timeout == seconds:
            return
        slot.busy_timeout = seconds
        if slot.conn is not None:
            busy = QUERIES["connection_busy_timeout"]
            with self._errors():
                slot.conn.execute(busy.replace("{ms}", str(int(self._busy_timeout() * 1000))))

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._errors():
            return _rows(self._conn().execute(QUERIES[name], params or {}))

    def _now_param(self, now: datetime | None) -> float | None:
        return None if now is None else now.timestamp()

    def _jobs(self, rows: list[dict[str, Any]], *, dead: bool = False) -> list[Job]:
        return [job_from_row(row, epoch_to_datetime, dead=dead) for row in rows]

    def _probe(self, name: str, params: dict[str, Any] | None = None) -> bool:
        """Whether a periodic write has anything to do (see the ``*_probe``
        queries: a lock-free read, so idle polls take no write lock).
        """
        with self._errors():
            return self._conn().execute(QUERIES[name], params or {}).fetchone() is not None

    def _release_thread(self) -> None:
        """Close this thread's connection: the thread is about to end, and a
        connection left in the list would stay open until :meth:`close`.
        """
        slot: ThreadConnection | None = getattr(self._local, "slot", None)
        if slot is None:
            return
        with self._threads_lock:
            if slot.depth:
                return
            conn, slot.conn = slot.conn, None
            self._threads.discard(slot)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close every thread's connection: at once where its thread is
        between calls, else as its call ends (the call finishes first). The
        next call of any thread opens a new one.
        """
        idle: list[sqlite3.Connection] = []
        with self._threads_lock:
            for slot in list(self._threads):
                if slot.conn is not None and slot.depth:
                    slot.doomed = True
                    continue
                if slot.conn is not None:
                    idle.append(slot.conn)
                    slot.conn = None
                self._threads.discard(slot)
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()
