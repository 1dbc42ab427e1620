"""SQLite's wake-ups: what LISTEN/NOTIFY is on PostgreSQL, from three sources.

- In-process: a commit that makes jobs available (an enqueue, a staging, a
  retry) wakes the listeners of this process on the same database file at
  once (:func:`wake`).
- Other processes, at once: the same commit sends a byte to every other
  process listening on that file through the wake channel beside it (see
  :mod:`.wakechannel`).
- Other processes, as the fallback: ``PRAGMA data_version`` changes on a
  connection whenever another connection commits. The listener reads it on
  its own connection: a counter in the WAL's shared memory, a few
  microseconds and no I/O. Every ``CHANGE_POLL`` seconds when it has no wake
  channel (a pickup latency of about half of that), every ``CHANNEL_POLL``
  seconds when it has one: then it only catches what no datagram announced
  (an enqueue inside the caller's own transaction, a datagram lost).

Either way the listener calls ``on_queue("*")``: SQLite cannot say what the
commit was (a delayed enqueue by another process sends no due time), so the
worker looks for work and stages due jobs soon after.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from jobkeeper.backends.sqlite import wakechannel
from jobkeeper.errors import DatabaseError

logger = logging.getLogger("jobkeeper.sqlite")

#: Seconds between two reads of ``data_version`` by a listener with no wake
#: channel.
CHANGE_POLL = 0.01
#: The same with a wake channel: the fallback for what no datagram announced.
CHANNEL_POLL = 0.05
#: Longest wait between two looks at the listener's ``stop``, in seconds.
STOP_CHECK = 0.05
#: Seconds between two looks at whether the listener's socket file is still
#: there (someone removed the channel directory: bind again).
CHANNEL_CHECK = 1.0
#: Seconds a listener waits after a failed read before it reads again.
ERROR_PAUSE = 0.1

# Doorbells of this process's listeners per database file (absolute path).
_listeners: dict[str, set[_Doorbell]] = {}
_listeners_lock = threading.Lock()
# Database files whose missing wake channel was already logged.
_said_no_channel: set[str] = set()


def wake(path: str) -> None:
    """Wake every listener on the database file ``path``: this process's at
    once, other processes' through the wake channel. Call after the commit.
    """
    with _listeners_lock:
        bells = list(_listeners.get(path, ()))
    for bell in bells:
        bell.ring()
    wakechannel.notify(path)


class _Doorbell:
    """What a listener waits on: rings from this process and, once
    :meth:`open_channel` succeeded, datagrams from others.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._pair: tuple[socket.socket, socket.socket] | None = None
        with contextlib.suppress(OSError, AttributeError):
            reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            reader.setblocking(False)
            writer.setblocking(False)
            self._pair = (reader, writer)
        self._channel: socket.socket | None = None
        self._address = ""

    @property
    def has_channel(self) -> bool:
        return self._channel is not None

    def open_channel(self, path: str) -> str | None:
        """Bind in the wake channel of ``path``; the reason why not, or None."""
        if self._pair is None:
            return "no Unix datagram sockets"
        try:
            self._channel, self._address = wakechannel.bind(path)
        except OSError as exc:
            return str(exc)
        return None

    def check_channel(self, path: str) -> None:
        """Bind again if the socket's file was removed (nothing could reach
        this listener through it any more).
        """
        if self._channel is None or os.path.exists(self._address):
            return
        wakechannel.unbind(self._channel, self._address)
        self._channel = None
        self.open_channel(path)

    def ring(self) -> None:
        if self._pair is None:
            self._event.set()
            return
        with contextlib.suppress(OSError):  # full: a ring already waits
            self._pair[1].send(b"\0")

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a ring or a datagram; whether
        one came (all that arrived are taken).
        """
        if self._pair is None:
            rang = self._event.wait(timeout)
            self._event.clear()
            return rang
        sockets = [self._pair[0]]
        if self._channel is not None:
            sockets.append(self._channel)
        ready, _, _ = select.select(sockets, [], [], timeout)
        for sock in ready:
            with contextlib.suppress(OSError):
                while sock.recv(64):
                    pass
        return bool(ready)

    def close(self) -> None:
        if self._channel is not None:
            wakechannel.unbind(self._channel, self._address)
            self._channel = None
        if self._pair is not None:
            for sock in self._pair:
                sock.close()


def listen(
    path: str,
    data_version: Callable[[], int],
    on_queue: Callable[[str], None],
    stop: threading.Event,
) -> None:
    """Call ``on_queue("*")`` on every wake-up for ``path`` and every change
    of ``data_version()`` until ``stop`` is set.

    Args:
        path: the database file's absolute path.
        data_version: reads ``PRAGMA data_version`` on the listener's own
            connection (it raises :class:`~jobkeeper.errors.DatabaseError`).
        on_queue: the worker's wake-up.
        stop: set to return (within ``STOP_CHECK`` seconds).
    """
    bell = _Doorbell()
    reason = bell.open_channel(path)
    if reason is not None and path not in _said_no_channel:
        _said_no_channel.add(path)
        logger.info(
            "no wake channel beside %s (%s): other processes' enqueues are noticed "
            "by reading data_version every %.0f ms",
            path,
            reason,
            CHANGE_POLL * 1000,
        )
    with _listeners_lock:
        _listeners.setdefault(path, set()).add(bell)
    try:
        version: int | None = None
        read_at = time.monotonic()
        check_at = read_at + CHANNEL_CHECK
        while not stop.is_set():
            if time.monotonic() >= check_at:
                bell.check_channel(path)
                check_at = time.monotonic() + CHANNEL_CHECK
            if bell.wait(min(max(read_at - time.monotonic(), 0.0), STOP_CHECK)):
                # A ring or a datagram comes after its commit: wake the worker
                # now, not after a read of its own. The read stays on its
                # schedule: the change it then sees may be this commit again
                # (one look for nothing), never a commit it missed.
                on_queue("*")
            if time.monotonic() < read_at:
                continue
            read_at = time.monotonic() + (CHANNEL_POLL if bell.has_channel else CHANGE_POLL)
            try:
                current = data_version()
            except DatabaseError as exc:
                # A locked or briefly unreadable file: something is going on,
                # so look for work, and read again after a pause.
                logger.debug("data_version unreadable (%s)", exc)
                on_queue("*")
                version = None
                stop.wait(ERROR_PAUSE)
                continue
            # Every commit since the last read, announced or not, changed the
            # value: this wake-up comes after all of them.
            if version is not None and current != version:
                on_queue("*")
            version = current
    finally:
        with _listeners_lock:
            listeners = _listeners.get(path)
            if listeners is not None:
                listeners.discard(bell)
                if not listeners:
                    del _listeners[path]
        bell.close()
