"""Exceptions: control flow raised by tasks, and the errors jobkeeper raises.

Leaf module: imports nothing from the rest of jobkeeper.
"""

from __future__ import annotations

import re
from typing import Any

#: Longest repr of a refused value quoted in an error, in characters.
MAX_SHOWN = 200


def shown(value: Any) -> str:
    """``repr(value)`` for an error message that refuses it: cut to
    ``MAX_SHOWN`` characters, and never raising (a user's object whose
    ``__repr__`` fails must not turn a ConfigError into that failure).
    """
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - whatever a user's __repr__ raises
        return f"<a {type(value).__name__} whose repr() raised>"
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def query_excerpt(query: object, length: int) -> str:
    """A session's query (``pg_stat_activity.query``) on one line for a
    message: SQL comments dropped (jobkeeper's own queries, and many an
    ORM's, start with one, which told nothing of the statement), runs of
    white space made one space, cut to ``length`` characters.
    """
    text = _SQL_COMMENT.sub(" ", str(query))
    return " ".join(text.split())[:length]


_SQL_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


#: What may not reach a log line or a terminal as it is: C0 and C1 control
#: characters and DEL, the Unicode line and paragraph separators (a line
#: break to many readers), every bidirectional control (the marks, the
#: embeddings, overrides and isolates, which reorder what is shown) and the
#: invisible format characters (zero width space, word joiner, BOM); as the
#: escapes Python's repr uses.
_UNSAFE = (
    *range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200B, 0x200E, 0x200F,
    0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2060, 0x2070), 0xFEFF,
)  # fmt: skip
_CONTROL_ESCAPES = {code: repr(chr(code))[1:-1] for code in _UNSAFE}
#: Those a JSON encoder leaves raw (it escapes C0 itself), as JSON escapes.
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in _UNSAFE if code >= 0x20}


def printable(text: str) -> str:
    """``text`` on one line, with no control character: a newline, a carriage
    return, an ESC and the like written as ``\\n``, ``\\r``, ``\\x1b``, as
    repr writes them. For text that came from a job (an exception's message,
    a task name written by hand) shown in a log line or a terminal, where it
    could otherwise forge a line or move the cursor.
    """
    return text.translate(_CONTROL_ESCAPES)


def printable_json(text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``, which keeps
    non-ASCII text readable) with the characters :func:`printable` escapes
    written as JSON ``\\u`` escapes: the same value, safe on a terminal.
    Outside strings JSON holds none of them, so only strings change.
    """
    return text.translate(_JSON_ESCAPES)


def _delay_seconds(kind: str, delay: Any) -> float:
    """``Retry``'s or ``Snooze``'s delay as finite seconds >= 0.

    Raises:
        ValueError: not an int or float (a bool, a str...), or negative,
            NaN, infinite or past float's range.
    """
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise ValueError(f"{kind} delay must be a number of seconds, got {shown(delay)}")
    try:
        seconds = float(delay)
    except OverflowError:
        raise ValueError(
            f"{kind} delay must be seconds within float's range, got {shown(delay)}"
        ) from None
    if not (0.0 <= seconds < float("inf")):
        raise ValueError(f"{kind} delay must be a finite number >= 0, got {shown(delay)}")
    return seconds


class Retry(Exception):  # noqa: N818 - the contract's name
    """Raise inside a task to retry the job after ``delay`` seconds.

    The attempt still counts against ``max_attempts``; once they are used up
    the job goes to the dead letters like any other failure.

    Args:
        delay: seconds from now (database clock) before the next attempt;
            ``None`` uses the normal exponential backoff. Must be finite and >= 0;
            a delay past about 100 years (``backoff.ABSOLUTE_MAX_BACKOFF``)
            waits that long, so that the time is storable in every backend.
        reason: text recorded in the job's ``errors`` for this attempt.

    Raises:
        ValueError: ``delay`` is negative, NaN, infinite or not a number.
    """

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        if delay is not None:
            delay = _delay_seconds("Retry", delay)
        super().__init__(reason)
        self.delay = delay
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its arguments (Django's parallel test runner, a process
        # pool): the default gives __init__ the message instead.
        return (type(self), (self.delay, self.reason))


class Snooze(Exception):  # noqa: N818 - the contract's name
    """Raise inside a task to run the job again after ``delay`` seconds
    without spending the attempt (Oban's and River's snooze).

    The job goes back to ``scheduled`` at now + ``delay`` by the database
    clock; no entry is added to its ``errors`` and its ``attempt`` is as it
    was before this attempt started, so snoozes never count toward
    ``max_attempts``. A job with a cancel request ends ``cancelled`` instead.

    Args:
        delay: seconds from now (database clock), finite and >= 0; past
            about 100 years (``backoff.ABSOLUTE_MAX_BACKOFF``) it waits that
            long, as :class:`Retry` does.

    Raises:
        ValueError: ``delay`` is negative, NaN, infinite or not a number.
    """

    def __init__(self, delay: float) -> None:
        delay = _delay_seconds("Snooze", delay)
        super().__init__(f"snoozed for {delay:g}s")
        self.delay = delay

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.delay,))


class Discard(Exception):  # noqa: N818 - the contract's name
    """Raise inside a task to send the job straight to the dead letters.

    Args:
        reason: why; kept as the dead letter's reason and in its ``errors``.
    """

    def __init__(self, reason: str = "discarded") -> None:
        super().__init__(reason)
        self.reason = reason


class JobkeeperError(Exception):
    """Base class of every error jobkeeper raises."""


class ConfigError(JobkeeperError, ValueError):
    """A setting, option, task definition or database URL is invalid."""


class PayloadError(JobkeeperError, ValueError):
    """Job arguments (or a result) are not storable: the message names the
    offending field (``args.a[1].b``) and value. Nothing was written.
    """


class JobNotFound(JobkeeperError, LookupError):  # noqa: N818 - reads better at call sites
    """No job (live or dead) has the given id (never existed, or a finished
    job already pruned after ``retention``).
    """


class JobFailed(JobkeeperError):  # noqa: N818 - the contract's name
    """Raised by ``wait``: the job is dead (attempts used up, or discarded).

    Attributes:
        job: the dead job; ``job.errors`` holds one entry per failed attempt.
    """

    def __init__(self, job: Any) -> None:
        last = job.errors[-1].get("error") if job.errors else None
        super().__init__(
            f"job {job.id} ({job.task}) is dead after {job.attempt} attempt(s)"
            + (f"; last error: {last}" if last else "")
        )
        self.job = job

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job,))


class JobCancelled(JobkeeperError):  # noqa: N818 - the contract's name
    """Raised by ``wait``: the job was cancelled.

    Attributes:
        job: the cancelled job.
    """

    def __init__(self, job: Any) -> None:
        super().__init__(f"job {job.id} ({job.task}) was cancelled")
        self.job = job

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job,))


class JobStateError(JobkeeperError):
    """The job is in a state that does not allow the requested action."""


class DatabaseError(JobkeeperError):
    """The database refused or failed an operation.

    Args:
        *args: the message, as for any exception.
        retry_asked: sets :attr:`retry_asked`.
    """

    #: Whether nothing of the call was written and running it again at once
    #: may succeed: the database aborted its transaction asking for a rerun
    #: (PostgreSQL's serialization failure, SQLSTATE 40001, or deadlock,
    #: 40P01), or -- on a :class:`DatabaseUnavailable` -- closed the session
    #: for sitting idle before the call's statement ran (57P05
    #: ``idle_session_timeout``; 25P03 ``idle_in_transaction_session_timeout``
    #: rolled the transaction back); a new session runs it. False otherwise.
    #: (On PostgreSQL an API call on the queue's own pool whose session was
    #: closed so runs once more by itself: callers meet it mostly on their
    #: own ``connection=``.)
    retry_asked: bool = False

    def __init__(self, *args: object, retry_asked: bool = False) -> None:
        super().__init__(*args)
        if retry_asked:
            self.retry_asked = True


class DatabaseUnavailable(DatabaseError):  # noqa: N818
    """The database cannot take the call now: down, restarting, read-only,
    out of disk, or locked past the busy timeout. Trying again later is the
    remedy.

    Nothing was written by the failed call, with one exception no client can
    rule out: when the connection is cut after a write was sent (the server
    restarts at that moment), the write may have committed before the reply
    was lost. An ``enqueue`` retried after such an error can then store the
    job twice; a ``unique_key`` makes the retry safe.

    One subclass does not pass with time: :class:`DatabaseRefused`.

    Args:
        *args: the message, as for any exception.
        unreachable: sets :attr:`unreachable`.
        retry_asked: sets :attr:`~DatabaseError.retry_asked`.
    """

    #: Whether the database could not be reached (down, restarting, refusing
    #: connections, read-only): an outage. False when it answered and gave up
    #: on the call itself -- a cancelled statement, a full disk, a lock held
    #: past the busy timeout, a session it closed while idle -- which passes
    #: too, but says nothing of the server's reachability.
    unreachable: bool = True

    def __init__(self, *args: object, unreachable: bool = True, retry_asked: bool = False) -> None:
        super().__init__(*args, retry_asked=retry_asked)
        if not unreachable:
            self.unreachable = False


class DatabaseRefused(DatabaseUnavailable):
    """The database (or a pooler in front of it) refused the connection for a
    reason that waiting does not fix: the URL names a database or role that
    does not exist, the password is wrong, ``pg_hba.conf`` has no entry for
    this client, PgBouncer does not know the database or will not pass a
    startup parameter (the URL's ``options``). The message names the reason
    and what to change.

    A worker that meets it at start stops with it (``jobkeeper worker``
    exits 1) instead of waiting, as it waits out an outage. It is a
    :class:`DatabaseUnavailable` so that code already running treats it as
    one: a running worker retries through it (a password rotated or a
    database restored under it comes back without a restart), and an
    ``except DatabaseUnavailable`` still catches it. Nothing was written.
    """


class DatabaseReplaced(DatabaseError):  # noqa: N818 - reads as what happened
    """Internal (a :class:`DatabaseError` to callers): the SQLite file a
    connection has open is no longer the file at the URL's path -- removed,
    or replaced by another (a restore, ``rm`` and ``migrate``). A write on it
    would land in a file nobody will read again, so the write is rolled back
    and nothing was stored. Waiting does not fix it; a worker stops on it.

    Args:
        *args: the message, as for any exception.
        path: the database file's path, which :attr:`path` keeps.
    """

    #: The path of the removed or replaced file.
    path: str = ""

    def __init__(self, *args: object, path: str = "") -> None:
        super().__init__(*args)
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_replaced, (self.args, self.path))


def _replaced(args: tuple[object, ...], path: str) -> DatabaseReplaced:
    return DatabaseReplaced(*args, path=path)


class DataRejected(DatabaseError):  # noqa: N818
    """The database refused the data of a write (a value out of its range, a
    constraint). Trying the same write again fails the same way.
    """


class UniqueKeyConflict(DataRejected):
    """Internal: a write would give a second pending job of a task the same
    ``unique_key`` (a retry or a dead-letter requeue; enqueue resolves to the
    pending job instead). Backends raise it; the API says what is in the way.
    """


class JobTimeout(Exception):  # noqa: N818
    """An attempt ran longer than its task's ``timeout`` (seconds)."""


class TaskInterrupted(BaseException):
    """Internal: injected into a running sync task when its job is cancelled or its worker
    shuts down past the grace period. A BaseException so that a task's own
    ``except Exception`` does not swallow it.
    """


class QueueFull(JobkeeperError):  # noqa: N818 - the contract's name
    """An enqueue would take a queue past its ``max_pending`` (see
    ``JobQueue.configure_queue``); nothing was written. For ``enqueue_many``
    the whole batch was refused.

    Attributes:
        queue: the queue's name.
        limit: its ``max_pending``.
        count: its pending jobs (scheduled, available, claimed, retryable)
            when the enqueue was refused.
    """

    def __init__(self, queue: str, limit: int, count: int, adding: int = 1) -> None:
        super().__init__(
            f"queue {queue!r} is full: {count} pending job{'' if count == 1 else 's'}, "
            f"max_pending={limit}"
            + (f" (refused a batch of {adding} for it)" if adding != 1 else "")
            + "; nothing was written"
        )
        self.queue = queue
        self.limit = limit
        self.count = count
        self.adding = adding

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.queue, self.limit, self.count, self.adding))


class ClaimLost(JobkeeperError):  # noqa: N818 - the contract's name
    """Raised by :func:`jobkeeper.complete_in`: this worker no longer holds
    the running job (it was rescued after a heartbeat gap, handed back, or
    cancelled and ended), so the job may be running elsewhere. Nothing was
    written; the caller's transaction must roll back, so that its side
    effects are not committed twice (letting the exception propagate does
    that in ``with conn:`` / ``with conn.transaction():`` blocks).

    Attributes:
        job_id: the job's id.
        attempt: the attempt whose claim was lost.
        fence: that claim's fence.
    """

    def __init__(self, job_id: int, attempt: int, fence: int) -> None:
        super().__init__(
            f"job {job_id} attempt {attempt}: this worker no longer holds its claim "
            f"(fence {fence}); roll the transaction back"
        )
        self.job_id = job_id
        self.attempt = attempt
        self.fence = fence

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id, self.attempt, self.fence))
