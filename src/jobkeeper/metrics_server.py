"""The worker's metrics port (``jobkeeper worker --metrics-port``): a WSGI
server whose connections cannot pile up.

``prometheus_client.start_http_server`` gives every connection a thread
that waits for its request without a time limit: a client that connects
and sends nothing (a port scanner, a half-open health check, a stuck
scraper) held a thread of the worker for as long as it stayed connected,
one more per connection. Here a connection whose client sends nothing for
``IDLE_TIMEOUT`` seconds is closed, so such threads last seconds, not for
ever; one that trickles its request a byte at a time, each within the idle
timeout, is closed once ``REQUEST_DEADLINE`` seconds have passed since it
connected. Connections are not capped: a cap of 16 let 16 silent clients
(TCP health checks) turn every scrape away until they timed out. The exposition
itself is prometheus_client's (``make_wsgi_app``: content negotiation, gzip,
``name[]`` filters).
"""

from __future__ import annotations

import io
import socket
import time
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

#: Seconds a connection may wait between its bytes before it is closed.
IDLE_TIMEOUT = 10.0
#: Seconds from a connection's start within which its whole request must
#: have been read: a scrape's is one short GET.
REQUEST_DEADLINE = 30.0


class _DeadlineSocketReader(io.RawIOBase):
    """The connection's bytes for the request reader, each read given the
    idle timeout or the time left until the deadline, whichever is shorter:
    a timeout per ``recv`` alone let a client that sent a byte every few
    seconds keep its thread for as long as it kept trickling.
    """

    def __init__(self, connection: socket.socket, deadline: float) -> None:
        super().__init__()
        self._connection = connection
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not read within the deadline")
        self._connection.settimeout(min(IDLE_TIMEOUT, left))
        return self._connection.recv_into(buffer)


class _QuietHandler(WSGIRequestHandler):
    """A request handler that logs nothing (the worker's log is for jobs) and
    gives up on a silent connection: its reads time out.
    """

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(IDLE_TIMEOUT)
        deadline = time.monotonic() + REQUEST_DEADLINE
        # The socket's own reader is replaced: closed here, not left to the
        # collector (while it is open, closing the socket is deferred).
        self.rfile.close()
        self.rfile = io.BufferedReader(_DeadlineSocketReader(self.connection, deadline))

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        super().__init__(address, _QuietHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away or timed out: nothing to report


def bounded_server(host: str, port: int, app: Any) -> WSGIServer:
    """A bound WSGI server of ``app`` on ``host:port`` (IPv6 when ``host``
    resolves to it), not yet serving: call ``serve_forever`` on a thread.

    Raises:
        OSError: the address cannot be resolved or bound.
    """
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server = _BoundedServer((host, port), family)
    server.set_app(app)
    return server
