"""A TCP forwarder to the test PostgreSQL that can stop forwarding while it
keeps every socket open: to a client, a server that never answers (a
stopped server process, a stuck proxy). Its kernel still acknowledges, so
TCP keepalives and ``tcp_user_timeout`` see nothing wrong.

PostgreSQL only: SQLite has no network to be stuck on.

    with Blackhole() as hole:
        url = hole.url(pg_url)     # the same database, through the forwarder
        hole.stop_old()            # connections open now stop forwarding
        hole.stop_all()            # ... and new ones are accepted, never forwarded
        hole.heal()
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit


class _Pair:
    def __init__(self, client: socket.socket, epoch: int) -> None:
        self.client = client
        self.server: socket.socket | None = None
        self.epoch = epoch


class Blackhole:
    """A forwarder on 127.0.0.1 (a free port) to ``upstream``'s host and port."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._up = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._epoch = 0
        #: Connections of an epoch below this do not forward.
        self._stopped_below = 0
        #: New connections are not forwarded either.
        self._stop_new = False
        self._closed = False
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def url(self, target: str) -> str:
        """``target`` with its host and port replaced by the forwarder's."""
        parts = urlsplit(target)
        netloc = parts.netloc.rsplit("@", 1)
        where = f"127.0.0.1:{self.port}"
        netloc_new = f"{netloc[0]}@{where}" if len(netloc) == 2 else where
        return urlunsplit(parts._replace(netloc=netloc_new))

    def stop_old(self) -> None:
        with self._lock:
            self._epoch += 1
            self._stopped_below = self._epoch

    def stop_all(self) -> None:
        with self._lock:
            self._epoch += 1
            self._stopped_below = self._epoch
            self._stop_new = True

    def heal(self) -> None:
        with self._lock:
            self._stopped_below = 0
            self._stop_new = False

    def _blocked(self, pair: _Pair) -> bool:
        return pair.epoch < self._stopped_below or (self._stop_new and pair.epoch >= self._epoch)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                pair = _Pair(client, self._epoch)
                self._pairs.append(pair)
            thread = threading.Thread(target=self._pump, args=(pair,), daemon=True)
            thread.start()

    def _pump(self, pair: _Pair) -> None:
        # Not connected upstream while blocked: a new connection hangs in its start-up.
        while self._blocked(pair) and not self._closed:
            select.select([], [], [], 0.05)
        try:
            pair.server = socket.create_connection(self._up)
        except OSError:
            pair.client.close()
            return
        ends = {pair.client: pair.server, pair.server: pair.client}
        try:
            while not self._closed:
                if self._blocked(pair):
                    # Nothing read, nothing sent; both sockets stay open.
                    select.select([], [], [], 0.05)
                    continue
                readable, _, _ = select.select(list(ends), [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    ends[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in ends:
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            for sock in (pair.client, pair.server):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def blackhole(upstream: str) -> Iterator[Blackhole]:
    with Blackhole(upstream) as hole:
        yield hole
