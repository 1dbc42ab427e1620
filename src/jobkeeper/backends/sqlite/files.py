"""What the SQLite backend asks of the file system about its database file
(internal): why it cannot be written, whether it is empty, and which file
the path names now.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def not_writable_hint(path: str) -> str:
    """Why SQLite may not be able to write ``path``, as a sentence to append
    to its error (which says only "unable to open database file" or
    "attempt to write a readonly database"), or "" when nothing is seen.
    SQLite in WAL mode writes ``<file>-wal`` and ``<file>-shm`` beside the
    file even to read it, so its directory must be writable too.
    """
    directory = os.path.dirname(path) or "."
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return (
                f" -- {directory!r} is on a read-only file system (jobkeeper writes the file, "
                "and SQLite its -wal and -shm beside it)"
            )
    except OSError:
        return ""
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f" -- the file is not writable by this user (uid {os.getuid()})"
    if not os.access(directory, os.W_OK | os.X_OK):
        name = os.path.basename(path)
        return (
            f" -- its directory {directory!r} is not writable by this user (uid "
            f"{os.getuid()}): SQLite's WAL mode creates {name}-wal and {name}-shm there"
        )
    return ""


def file_identity(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at ``path`` (symbolic links followed,
    as SQLite follows them), or None when nothing is there.

    sqlite3 gives no way to ``fstat`` the file a connection has open, so a
    connection records its path's identity when it opens, and a later
    identity that differs (or none) means the file it has open was removed
    or replaced since: ``rm -rf`` of the directory, a restore, ``rm`` and
    ``migrate``. Its writes would go to a deleted file, and SQLite says
    nothing of it. One ``stat`` call: about 1-2 microseconds.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return None  # a directory on the path gone or unreadable: not our file either
    return st.st_dev, st.st_ino


def is_empty_file(path: str) -> bool:
    """Whether ``path`` is a file of 0 bytes (False when it cannot be read)."""
    try:
        return os.stat(path).st_size == 0
    except OSError:
        return False  # gone meanwhile, or unreadable: the connect says which


def holders_of_removed(path: str) -> list[int] | None:
    """The ids of other processes that have a removed or replaced copy of the
    database file ``path`` open (read from ``/proc/<pid>/fd``: Linux, and
    only the processes this user may inspect), or None where there is no
    ``/proc`` to read. What ``doctor``, a new process that sees only the file
    now at the path, can say of processes still serving the one before.
    """
    now = file_identity(path)
    real = os.path.realpath(path)  # what /proc's links name
    return _holders({real, f"{real} (deleted)"}, lambda st: st != now, others=True)


def leftovers_in_use(path: str) -> tuple[list[str], list[int]]:
    """The ``-wal`` and ``-shm`` files beside ``path`` (a database file that
    does not exist, or is empty), and the processes, this one included, that
    still have them open: ``([], [])`` when there are none, or no ``/proc``.

    They are the WAL and the shared memory index of a database file removed
    while those processes had it open. SQLite finds them by name, so a new
    file created at the path would share them: its first connection reads
    the removed file's index ("disk I/O error", or the removed file's pages
    read as the new one's). With no process on them they are harmless: SQLite
    discards a WAL beside a database file that has no pages.
    """
    names = [name for name in (f"{path}-wal", f"{path}-shm") if os.path.exists(name)]
    if not names:
        return [], []
    ids = {file_identity(name) for name in names}
    # /proc's links name the real path: a symlink in ``path`` hid the holders.
    holders = _holders(
        {os.path.realpath(name) for name in names}, lambda st: st in ids, others=False
    )
    return (names, holders) if holders else ([], [])


def leftovers_refusal(path: str) -> str:
    """Why no database may be created at ``path`` now (see
    :func:`leftovers_in_use`), or "": the message names the files, the
    processes and what to do.
    """
    names, holders = leftovers_in_use(path)
    if not holders:
        return ""
    files = " and ".join(os.path.basename(name) for name in names)
    who = ", ".join(str(pid) for pid in holders if pid != os.getpid())
    who = f"process(es) {who}" if who else ""
    if os.getpid() in holders:
        who = f"{who} and this process" if who else "this process (a queue not closed)"
    return (
        f"SQLite database {path!r} does not exist, but {files} beside it "
        f"{'are' if len(names) > 1 else 'is'} still open in {who}, which still "
        "have the removed database file open (a worker or another program started on it): a "
        "database created now would share them with the removed one (SQLite fails with "
        "'disk I/O error', or reads the removed file's pages). Nothing was created. Stop "
        "those processes (a jobkeeper worker stops by itself once it sees its file gone), then "
        "create it again: SQLite discards a -wal and -shm that belong to no database file"
    )


def _holders(
    names: set[str], matches: Callable[[tuple[int, int]], bool], *, others: bool
) -> list[int] | None:
    """The processes (only others when ``others``) with an open file whose
    link in ``/proc/<pid>/fd`` reads one of ``names`` and whose
    ``(st_dev, st_ino)`` ``matches``; None without ``/proc``.
    """
    if not os.path.isdir("/proc/self/fd"):
        return None
    holders = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (others and int(entry) == os.getpid()):
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            link = f"/proc/{entry}/fd/{fd}"
            try:
                if os.readlink(link) not in names:
                    continue
                st = os.stat(link)  # the open file itself, not the path
            except OSError:
                continue
            if matches((st.st_dev, st.st_ino)):
                holders.append(int(entry))
                break
    return sorted(holders)
