"""SQLite's cross-process wake channel (internal): what NOTIFY is on
PostgreSQL, as Unix datagram sockets in a directory beside the database file.

Each listening process binds one socket, ``<db>-wake/<pid>-<random>.sock``
(the directory made 0700 by the first listener, next to a file the user
already owns). A process that commits available jobs sends one byte to every
other process's socket there after its commit (:func:`notify`): non-blocking,
errors ignored, so a commit never waits on a listener. A socket whose process
died refuses the datagram and is removed.

Nothing depends on a datagram arriving: the listener still reads ``PRAGMA
data_version`` (see :mod:`.wakeups`), so a lost or refused one costs latency,
never a job. Where no socket can be bound (a read-only directory, another
user's channel, a path too long for a socket, no Unix sockets) the listener
falls back to that poll alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat

#: What the channel directory's name adds to the database file's path.
DIRECTORY_SUFFIX = "-wake"
SOCKET_SUFFIX = ".sock"


def directory_of(path: str) -> str:
    """The channel directory of the database file ``path`` (absolute)."""
    return path + DIRECTORY_SUFFIX


def bind(path: str) -> tuple[socket.socket, str]:
    """Bind this process's socket in the channel of the database file ``path``.

    Args:
        path: the database file's absolute path.

    Returns:
        The non-blocking bound socket and its file's path (remove it with
        :func:`unbind`).

    Raises:
        OSError: no channel here (the reason in its message): Unix datagram
            sockets unsupported, the directory not creatable or not ours, the
            socket's path too long.
    """
    if not hasattr(socket, "AF_UNIX"):
        raise OSError("no Unix sockets on this platform")
    directory = directory_of(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{directory!r} is not a directory")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        # Another user's channel: its sockets are not ours to bind beside or
        # to clean up.
        raise OSError(f"{directory!r} belongs to another user")
    address = os.path.join(directory, f"{os.getpid()}-{secrets.token_hex(4)}{SOCKET_SUFFIX}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock, address


def unbind(sock: socket.socket, address: str) -> None:
    """Close a socket from :func:`bind` and remove its file."""
    sock.close()
    with contextlib.suppress(OSError):
        os.unlink(address)


def notify(path: str) -> None:
    """Send one byte to every other process listening on the database file
    ``path``; never raises, never blocks.
    """
    directory = directory_of(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return  # no channel: nobody listens through one
    own = f"{os.getpid()}-"
    targets = [n for n in names if n.endswith(SOCKET_SUFFIX) and not n.startswith(own)]
    if not targets:
        return
    try:
        # One socket per commit: microseconds beside the commit's fsync, and
        # nothing left open for a fork to share or an exit to warn about.
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except (OSError, AttributeError):
        return
    with sender:
        sender.setblocking(False)
        for name in targets:
            address = os.path.join(directory, name)
            try:
                sender.sendto(b"\0", address)
            except ConnectionRefusedError:
                # Nobody bound to it: its process died without removing it.
                with contextlib.suppress(OSError):
                    os.unlink(address)
            except OSError:
                # Its buffer full (bytes already wait there: it is being
                # woken), removed meanwhile, or not ours to write to.
                pass
