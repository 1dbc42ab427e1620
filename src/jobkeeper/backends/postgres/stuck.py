"""Calls on our connections that never return (internal): the stuck-call
watchdog.

A server that stops answering while its socket stays open (a stopped
server process, a stuck proxy or middlebox: the kernel still acknowledges,
so TCP keepalives and ``tcp_user_timeout`` see nothing wrong) left every
thread of a worker waiting in psycopg for as long as it lasted (4.5 min in
break-test 121, not one log line), a SIGTERM with them, and a sync
``enqueue`` in the pool's pre-use ping for 141.8 s.

Each call on a connection of ours is noted in :data:`CALLS` on entry and
removed on exit (a dict set and pop: nothing more on the hot path). A
daemon thread, started with the first call, looks every :data:`TICK`
seconds for calls older than their threshold, warns, and asks the server,
on a fresh connection, what the call's session is doing
(``pg_stat_activity`` by backend pid): a session running it (a lock wait
behind a migration, a long VACUUM) is left alone, it is the server's time;
one that is idle (the answer was sent and never arrived), gone, or a
server that cannot be reached, gets its connection cut from our side
(``shutdown`` of the socket: nothing is sent on it), so the call fails as a
lost connection and the callers' reconnect logic takes over.

A connection whose owner is stopping (a worker after its signal: its
``Watch.stopping`` is set) is looked at after :data:`STOP_STUCK_AFTER` seconds
instead of its threshold. Only the look comes sooner: the verdict is the
same, so a call the server is running is still left alone, and a call cut
then could never have been answered anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from jobkeeper.backends.postgres.queries import QUERIES

logger = logging.getLogger("jobkeeper.postgres")

#: Seconds a call may go without an answer before the watchdog warns and
#: asks the server about it, unless its connection says otherwise: the
#: API pool's ``POOL_TIMEOUT``; a worker's connections get a quarter of
#: ``rescue_after`` at most (``worker.exit_bound.stuck_after_for``).
STUCK_AFTER = 10.0
#: Fewest seconds a threshold may be: each check opens a connection.
STUCK_AFTER_MIN = 1.0
#: The threshold of a connection whose owner is stopping (``Watch.stopping``):
#: a stop has ``shutdown_grace`` + 12 s before the exit bound ends the
#: process (``worker.exit_bound``), and a worker's usual threshold (up to
#: 10 s) plus a probe took most of that for each stuck call it met.
STOP_STUCK_AFTER = STUCK_AFTER_MIN
#: Seconds between the watchdog's looks at the calls in flight.
TICK = 0.5
#: Seconds between warnings about one call the server is still running.
REMIND_EVERY = 60.0
#: Seconds a probe (a fresh connection, one query) may take in all.
PROBE_TIMEOUT = 5.0
#: Seconds a session must have been idle before its call is judged lost: a
#: call of several statements is idle between them for its Python's time.
IDLE_MARGIN = 2.0


@dataclass(frozen=True)
class Watch:
    """What the watchdog knows of a connection's owner.

    Attributes:
        name: what log lines call the connection.
        stuck_after: seconds without an answer before it is looked at.
        conninfo: how to reach the same server for the probe.
        stopping: set once the owner is stopping: the threshold is then
            :data:`STOP_STUCK_AFTER` at most (None: never).
    """

    name: str
    stuck_after: float
    conninfo: str
    stopping: threading.Event | None = None

    def threshold(self) -> float:
        """Seconds a call may go without an answer before it is looked at, now."""
        if self.stopping is not None and self.stopping.is_set():
            return min(self.stuck_after, STOP_STUCK_AFTER)
        return self.stuck_after


#: In-flight calls: key -> (connection, time.monotonic() at entry, Watch).
CALLS: dict[int, tuple[Any, float, Watch]] = {}
_started = False
_start_lock = threading.Lock()


def enter(key: int, conn: Any, watch: Watch) -> None:
    """Note a call on ``conn`` (``key``: one call at a time per key)."""
    CALLS[key] = (conn, time.monotonic(), watch)
    if not _started:
        _start()


def leave(key: int) -> None:
    CALLS.pop(key, None)


@contextlib.contextmanager
def watched(conn: Any, watch: Watch) -> Iterator[None]:
    """A call on ``conn`` outside the sources' own bookkeeping (LISTEN)."""
    enter(id(conn), conn, watch)
    try:
        yield
    finally:
        leave(id(conn))


def _forget_after_fork() -> None:
    """A forked child has no watchdog thread, and none of its parent's calls."""
    global _started
    _started = False
    CALLS.clear()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_forget_after_fork)


def _start() -> None:
    global _started
    with _start_lock:
        if _started:
            return
        threading.Thread(target=_run, name="jobkeeper-stuck-calls", daemon=True).start()
        _started = True


def cut_reason(conn: Any) -> str | None:
    """Why the watchdog cut ``conn``, if it did."""
    return getattr(conn, "_jobkeeper_cut", None)


#: pg_stat_activity states of a session waiting for its client.
IDLE = ("idle", "idle in transaction", "idle in transaction (aborted)")


class _Seen:
    """What the watchdog did about one call."""

    __slots__ = ("next_look", "warned_at")

    def __init__(self) -> None:
        self.warned_at: float | None = None
        self.next_look = 0.0


def _run() -> None:
    seen: dict[tuple[int, float], _Seen] = {}
    while True:
        time.sleep(TICK)
        try:
            _pass(seen)
        except Exception:  # the watchdog must outlive any surprise
            logger.exception("the stuck-call watchdog failed a pass; going on")


def _pass(seen: dict[tuple[int, float], _Seen]) -> None:
    now = time.monotonic()
    calls = CALLS.copy()
    current = {(key, entry[1]) for key, entry in calls.items()}
    for done in [k for k in seen if k not in current]:
        del seen[done]
    # By server (a worker's connections differ only by their sessions'
    # names): one probe each, all at once, so that a server that cannot be
    # reached costs one PROBE_TIMEOUT per pass, not one per connection.
    due: dict[tuple[tuple[str, str], ...], list[tuple[int, tuple[Any, float, Watch], _Seen]]] = {}
    for key, entry in calls.items():
        _, started, watch = entry
        if now - started < watch.threshold():
            continue
        state = seen.setdefault((key, started), _Seen())
        if now >= state.next_look:
            due.setdefault(_server(watch.conninfo), []).append((key, entry, state))
    probes = []
    for stuck in due.values():
        pids = {_backend_pid(entry[0]) for _, entry, _ in stuck}
        probes.append((_Probe(stuck[0][1][2].conninfo, [pid for pid in pids if pid]), stuck))
    deadline = time.monotonic() + PROBE_TIMEOUT
    for probe, stuck in probes:
        verdict = probe.verdict(deadline)
        for key, entry, state in stuck:
            _judge(key, entry, state, verdict)


def _server(conninfo: str) -> tuple[tuple[str, str], ...]:
    """``conninfo`` but for the session's name."""
    params = conninfo_to_dict(conninfo)
    params.pop("fallback_application_name", None)
    return tuple(sorted((k, str(v)) for k, v in params.items()))


def _backend_pid(conn: Any) -> int:
    try:
        return int(conn.info.backend_pid)
    except (psycopg.Error, ValueError, TypeError):
        return 0  # closed meanwhile


class _Verdict:
    """What a probe found: ``rows`` by pid, or why it could not tell."""

    def __init__(
        self,
        rows: dict[int, tuple[str | None, str | None, float]] | None,
        *,
        unreachable: str | None = None,
        unknown: str | None = None,
    ) -> None:
        self.rows = rows
        self.unreachable = unreachable
        self.unknown = unknown


class _Probe:
    """Ask the server about ``pids`` on a fresh connection, on a thread of
    its own: a server that accepts and never answers must not hold up the
    watchdog beyond :data:`PROBE_TIMEOUT`.
    """

    def __init__(self, conninfo: str, pids: list[int]) -> None:
        self._conninfo = conninfo
        self._pids = pids
        self._result: list[_Verdict] = []
        self._conn: list[psycopg.Connection[Any]] = []
        self._thread = threading.Thread(target=self._ask, name="jobkeeper-stuck-probe", daemon=True)
        self._thread.start()

    def _ask(self) -> None:
        try:
            with psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=max(int(PROBE_TIMEOUT) - 1, 2),
                fallback_application_name="jobkeeper stuck-call check",
            ) as probe:
                self._conn.append(probe)
                # Behind a pooler our sessions' pids are not the server's.
                own = probe.execute(QUERIES["connection_backend_pid"]).fetchall()[0][0]
                pooled = own != probe.info.backend_pid
                rows = probe.execute(QUERIES["connection_activity"], (self._pids,)).fetchall()
        except psycopg.Error as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if getattr(exc, "sqlstate", None):
                # The server answered (too many clients, a refused role): up,
                # but no way to tell what the session does.
                self._result.append(_Verdict(None, unknown=f"the check was refused: {text}"))
            else:
                self._result.append(_Verdict(None, unreachable=text))
            return
        if pooled:
            self._result.append(_Verdict(None, unknown="a pooler between us and the server"))
            return
        rows_by_pid = {row[0]: (row[1], row[2], row[3] or 0.0) for row in rows}
        self._result.append(_Verdict(rows_by_pid))

    def verdict(self, deadline: float) -> _Verdict:
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._result:
            return self._result[0]
        for conn in self._conn:
            _shut(conn)
        return _Verdict(
            None, unreachable=f"no answer to a new connection within {PROBE_TIMEOUT:g} s"
        )


def _judge(key: int, entry: tuple[Any, float, Watch], state: _Seen, verdict: _Verdict) -> None:
    conn, started, watch = entry
    age = time.monotonic() - started
    pid = _backend_pid(conn)
    why: str | None = None
    if verdict.unreachable is not None:
        why = f"the server cannot be reached ({verdict.unreachable})"
    elif verdict.rows is not None:
        row = verdict.rows.get(pid)
        if row is None:
            why = f"its session (pid {pid}) is gone from the server"
        elif row[0] in IDLE:
            if row[2] >= IDLE_MARGIN:
                why = (
                    f"its session (pid {pid}) has been {row[0]} for {row[2]:.0f} s: "
                    "the answer never arrived"
                )
        elif row[0] == "active" and row[1] == "ClientWrite":
            why = f"its session (pid {pid}) cannot send the answer (ClientWrite)"
    if why is not None:
        if CALLS.get(key) is not entry:
            return  # answered meanwhile
        logger.warning(
            "%s: a database call has had no answer for %.0f s and %s: cutting the "
            "connection; the call fails as a lost connection and the next one reconnects",
            watch.name,
            age,
            why,
        )
        _cut(key, entry, f"no answer for {age:.0f} s and {why}")
        return
    row = verdict.rows.get(pid) if verdict.rows is not None else None
    if verdict.unknown is not None:
        doing = f"cannot tell whether the server is still running it ({verdict.unknown})"
    elif row is not None and row[0] not in IDLE:
        waiting = f", waiting on {row[1]}" if row[1] else ""
        doing = f"the server is still running it (session pid {pid}, {row[0]}{waiting})"
    else:
        state.next_look = time.monotonic() + TICK  # idle for under IDLE_MARGIN: look again
        return
    now = time.monotonic()
    if state.warned_at is None or now - state.warned_at >= REMIND_EVERY:
        logger.warning(
            "%s: a database call has had no answer for %.0f s; %s: left to finish",
            watch.name,
            age,
            doing,
        )
        state.warned_at = now
    # Looked at again after another threshold: a lock wait may end in an
    # answer that is then lost.
    state.next_look = now + watch.threshold()


def _cut(key: int, entry: tuple[Any, float, Watch], reason: str) -> None:
    """Shut the socket of ``entry``'s connection down while its call still
    runs. The descriptor is duplicated first and the call checked to be the
    same after: a call that ended meanwhile may have closed its connection,
    and its descriptor's number may be another socket's by now.
    """
    conn = entry[0]
    try:
        dup = os.dup(conn.pgconn.socket)
    except (psycopg.Error, OSError):
        return  # closed meanwhile
    if CALLS.get(key) is not entry:
        os.close(dup)
        return
    conn._jobkeeper_cut = reason
    _shut_fd(dup)


def _shut_fd(fd: int) -> None:
    """Shut down the socket of ``fd``, a duplicate, and close ``fd``."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _shut(conn: Any) -> None:
    try:
        fd = os.dup(conn.pgconn.socket)
    except (psycopg.Error, OSError):
        return
    _shut_fd(fd)


def in_flight(now: float | None = None) -> list[tuple[str, float]]:
    """(connection name, seconds) of every call in flight, oldest first."""
    now = time.monotonic() if now is None else now
    calls = sorted(CALLS.values(), key=lambda entry: entry[1])
    return [(watch.name, now - started) for _, started, watch in calls]
