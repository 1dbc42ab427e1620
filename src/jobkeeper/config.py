"""Settings and the limits on names and options (the database URL: ``database_url``).

Leaf module: imports only ``errors`` and ``backoff``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from jobkeeper.models import WorkerInfo

from jobkeeper.backoff import ABSOLUTE_MAX_BACKOFF, DEFAULT_BASE, DEFAULT_MAX_BACKOFF
from jobkeeper.errors import ConfigError, PayloadError, shown

#: Queue and task names: 1-200 characters from letters, digits and ``_ . : - /``,
#: starting with a letter, digit or underscore. Kept narrow so names are safe
#: in logs, URLs, metric labels and NOTIFY payloads.
NAME_MAX_LENGTH = 200
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/\-]*\Z")
#: Longest accepted ``unique_key``, in characters.
UNIQUE_KEY_MAX_LENGTH = 500
#: Priorities are 32-bit signed integers; lower runs first.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
#: Largest ``max_attempts``.
MAX_ATTEMPTS_LIMIT = 1_000_000
#: Default ``max_crashes``: pinned crashes (a job that ran alone took its
#: worker down) before the job goes to the dead letters (DESIGN.md, "Poison jobs").
DEFAULT_MAX_CRASHES = 2
#: Most execution slots of one worker (``concurrency``).
MAX_CONCURRENCY = 10_000
#: Largest accepted ``delay`` in seconds (100 years).
MAX_DELAY = ABSOLUTE_MAX_BACKOFF


#: The default ``lock_wait`` of ``migrate`` (seconds): how long it may wait
#: in all for the locks it takes, in attempts of a second on PostgreSQL.
MIGRATE_LOCK_WAIT = 300.0
#: The default ``rescue_after`` (seconds); also what rescuers assume, at the
#: least, for workers of versions that did not record their own.
DEFAULT_RESCUE_AFTER = 60.0
#: The least ``rescue_after`` accepted, in heartbeat intervals: below it a
#: live worker looks dead after one slow heartbeat (pgqueuer#430).
MIN_RESCUE_BEATS = 3
#: What ``jobkeeper doctor`` recommends, in heartbeat intervals: accepted
#: values below it leave little margin for a heartbeat delayed by a busy
#: process (the GIL) or a slow database.
RECOMMENDED_RESCUE_BEATS = 5
#: Longest accepted duration setting: 100 years, in seconds (the backoff's own cap).
MAX_SETTING_SECONDS = ABSOLUTE_MAX_BACKOFF


def holder_window(declared: float | None, own: float) -> float:
    """Seconds of silence after which a worker is judged dead: the
    ``rescue_after`` it declared, or for a worker of a version that recorded
    none, ``own`` (the judge's setting) but at least the default, which is
    what such a worker most likely runs with.
    """
    return declared if declared is not None else max(own, DEFAULT_RESCUE_AFTER)


def heartbeat_age(worker: WorkerInfo, now: datetime) -> float:
    """Seconds since the worker's last heartbeat (never negative)."""
    return max(0.0, (now - worker.heartbeat_at).total_seconds())


def is_stale(worker: WorkerInfo, now: datetime, rescue_after: float) -> bool:
    """Whether the worker has been silent longer than its window, judged as
    the rescuers judge it (:func:`holder_window`, with ``rescue_after`` as the
    judge's own): it most likely died without deregistering (its running jobs
    are due for rescue).
    """
    return heartbeat_age(worker, now) > holder_window(worker.rescue_after, rescue_after)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Tunables of a :class:`~jobkeeper.JobQueue`; every duration is in seconds.

    Attributes:
        heartbeat_interval: how often a worker refreshes its heartbeat (s, default 5).
        rescue_after: seconds without a heartbeat after which a running job's
            holder is presumed dead and the job is rescued (default 60). Must be
            at least :data:`MIN_RESCUE_BEATS` (3) x ``heartbeat_interval`` so a
            live worker can miss a beat without losing its jobs (pgqueuer#430);
            :data:`RECOMMENDED_RESCUE_BEATS` (5) x or more is recommended.
        poll_interval: how often an idle worker looks for due work when no
            wake-up arrives (s, default 1).
        retention: how long completed and cancelled jobs are kept (s, default
            86400; 0 deletes them on completion).
        dead_retention: how long dead letters are kept before the pruner
            deletes them (s; default None: forever, until ``dead purge``).
        max_payload_bytes: largest encoded args/result, in bytes (default 1 MiB).
        shutdown_grace: on SIGTERM/SIGINT, how long running jobs may still
            finish before they are interrupted and handed back (s, default 30).
        backoff_base: exponential base of the retry backoff (default 2).
        max_backoff: cap on one retry delay (s, default 86400).
        busy_timeout: SQLite only: how long a statement waits for the write
            lock before failing (s, default 30).
        pool_size: PostgreSQL only: most pooled connections for API calls
            (enqueue, inspection, tasks that enqueue); default 10. Workers
            use dedicated connections besides, so heartbeats and acks never
            wait for this pool (graphile-worker#497).
        max_crashes: the crash budget (default 2): a job rescued from a
            worker that went silent while running it runs its next attempt
            alone on its worker; once ``max_crashes`` of its lone attempts
            have ended with their worker dead it goes to the dead letters,
            attempts left or not. A task's own ``max_crashes`` wins.
    """

    heartbeat_interval: float = 5.0
    rescue_after: float = DEFAULT_RESCUE_AFTER
    poll_interval: float = 1.0
    retention: float = 86_400.0
    max_payload_bytes: int = 1 << 20
    shutdown_grace: float = 30.0
    backoff_base: float = DEFAULT_BASE
    max_backoff: float = DEFAULT_MAX_BACKOFF
    busy_timeout: float = 30.0
    pool_size: int = 10
    dead_retention: float | None = None
    max_crashes: int = DEFAULT_MAX_CRASHES

    def __post_init__(self) -> None:
        check_max_crashes(self.max_crashes)
        for name in (
            "heartbeat_interval",
            "rescue_after",
            "poll_interval",
            "shutdown_grace",
            "retention",
            "max_backoff",
            "busy_timeout",
        ):
            value = getattr(self, name)
            positive = name in ("heartbeat_interval", "rescue_after", "poll_interval")
            check_seconds(name, value, allow_zero=not positive)
            # max_backoff is a cap itself, clamped where used (any value works).
            if value > MAX_SETTING_SECONDS and name != "max_backoff":
                # now() - a longer interval is before what PostgreSQL can
                # store ("timestamp out of range"): every rescue or prune
                # query using it would fail, for every worker of the
                # database; and thread waits that long overflow.
                raise ConfigError(
                    f"{name}={value!r} is longer than {MAX_SETTING_SECONDS:.0f} seconds (100 years)"
                )
        if self.dead_retention is not None:
            check_seconds("dead_retention", self.dead_retention)
            if self.dead_retention > MAX_SETTING_SECONDS:
                raise ConfigError(
                    f"dead_retention={self.dead_retention!r} is longer than "
                    f"{MAX_SETTING_SECONDS:.0f} seconds (100 years); None keeps them forever"
                )
        # Compared with a relative tolerance: 3 * 0.1 is 0.30000000000000004
        # in binary floating point, and rescue_after=0.3 is exactly 3 beats.
        if self.rescue_after < MIN_RESCUE_BEATS * self.heartbeat_interval * (1 - 1e-9):
            raise ConfigError(
                f"rescue_after={self.rescue_after} must be at least {MIN_RESCUE_BEATS} x "
                f"heartbeat_interval={self.heartbeat_interval}: a live worker would "
                "otherwise look dead after one slow heartbeat and its jobs would run twice"
            )
        if not isinstance(self.max_payload_bytes, int) or isinstance(self.max_payload_bytes, bool):
            raise ConfigError(
                f"max_payload_bytes must be an int, got {shown(self.max_payload_bytes)}"
            )
        if not 1 <= self.max_payload_bytes <= 256 << 20:
            raise ConfigError(
                f"max_payload_bytes={self.max_payload_bytes} must be between 1 and {256 << 20}"
            )
        if not is_int_between(self.pool_size, 1, 1000):
            raise ConfigError(
                f"pool_size must be an int between 1 and 1000, got {shown(self.pool_size)}"
            )
        base = self.backoff_base
        if isinstance(base, bool) or not isinstance(base, int | float) or not 1 < base < math.inf:
            raise ConfigError(f"backoff_base must be a finite number > 1, got {shown(base)}")


def check_seconds(name: str, value: Any, *, allow_zero: bool = True) -> float:
    """Validate a duration in seconds and return it as a float.

    Raises:
        ConfigError: not a number, NaN/infinite, negative (or zero when not allowed).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        raise ConfigError(f"{name} is out of range, got {shown(value)}") from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be a finite number of seconds {bound}, got {shown(value)}")
    return number


def check_age(name: str, value: Any) -> float:
    """Validate an age in seconds (``older_than``): :func:`check_seconds`,
    zero allowed, at most ``MAX_SETTING_SECONDS``.

    Raises:
        ConfigError: as :func:`check_seconds`, or longer than 100 years.
    """
    number = check_seconds(name, value, allow_zero=True)
    if number > MAX_SETTING_SECONDS:
        raise ConfigError(f"{name}={value!r} is longer than 100 years")
    return number


@functools.lru_cache(maxsize=4096)
def _valid_name(name: str) -> bool:
    return 0 < len(name) <= NAME_MAX_LENGTH and _NAME.match(name) is not None


#: Digits a typed integer may have: more than any bound (int() refuses past 4,300).
MAX_DIGITS = 30


#: What :func:`parse_whole_number` says a whole number is, by default.
WHOLE_NUMBER_EXPECTED = "expected digits 0-9, with a minus sign in front if negative, e.g. 5 or -5"


def parse_whole_number(
    text: str, *, noun: str = "a whole number", expected: str = WHOLE_NUMBER_EXPECTED
) -> int:
    """``text`` as an int: ASCII digits after an optional ``-``, at most
    ``MAX_DIGITS`` of them. ``int()`` alone also takes spaces, ``_`` and other
    scripts' digits (``'١٢'``), which a number typed by mistake should not be.

    Args:
        text: what was typed.
        noun: what it should be, for the error (``"a job id"``).
        expected: the error's hint: what is expected instead. Where negative
            numbers are never valid (ids, counts), say so rather than offer
            a minus sign.

    Raises:
        ValueError: ``"'abc' is not {noun}: {expected}"``, or that it has too
            many digits.
    """
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"{text!r} is not {noun}: {expected}")
    if len(digits.lstrip("0")) > MAX_DIGITS:
        raise ValueError(f"{text[:40]!r}... has over {MAX_DIGITS} digits: out of range")
    return int(text)


def check_name(kind: str, name: Any) -> str:
    """Validate a queue or task name (see ``NAME_MAX_LENGTH``).

    Raises:
        ConfigError: naming the kind and the value.
    """
    if not isinstance(name, str):
        raise ConfigError(f"{kind} name must be a string, got {type(name).__name__} {shown(name)}")
    if not _valid_name(name):
        if len(name) > NAME_MAX_LENGTH:
            # Not the whole value: it may be a payload pasted in by mistake.
            raise ConfigError(
                f"{kind} name {name[:60]!r}... is too long: {len(name)} characters, "
                f"at most {NAME_MAX_LENGTH} (use 1-{NAME_MAX_LENGTH} characters)"
            )
        raise ConfigError(
            f"{kind} name {shown(name)} is invalid: use 1-{NAME_MAX_LENGTH} characters "
            "from letters, digits and _ . : - /, starting with a letter, digit or _"
        )
    return plain_str(name)


def plain_str(text: str) -> str:
    """``text`` as a plain ``str``: a subclass (a str Enum member) is stored
    as its value, since its own ``__str__``/``__format__`` may say
    ``"Queue.EMAILS"``.
    """
    return text if type(text) is str else str.__str__(text)


def is_int_between(value: Any, low: int, high: int) -> TypeGuard[int]:
    """Whether ``value`` is an int from ``low`` to ``high`` (a bool is not:
    ``True`` would pass as 1).
    """
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def check_priority(priority: Any) -> int:
    """Validate a priority (a 32-bit int; lower runs first)."""
    low, high = PRIORITY_RANGE
    if not is_int_between(priority, low, high):
        raise ConfigError(
            f"priority must be an int between {low} and {high}, got {shown(priority)}"
        )
    return int(priority)  # an IntEnum member: its plain value


def check_max_attempts(max_attempts: Any) -> int:
    """Validate ``max_attempts`` (1 .. ``MAX_ATTEMPTS_LIMIT``)."""
    if not is_int_between(max_attempts, 1, MAX_ATTEMPTS_LIMIT):
        raise ConfigError(
            f"max_attempts must be an int between 1 and {MAX_ATTEMPTS_LIMIT}"
            f", got {shown(max_attempts)}"
        )
    return int(max_attempts)  # an IntEnum member: its plain value


def check_max_crashes(max_crashes: Any) -> int:
    """Validate ``max_crashes`` (1 .. ``MAX_ATTEMPTS_LIMIT``).

    Raises:
        ConfigError: not an int in that range.
    """
    if not is_int_between(max_crashes, 1, MAX_ATTEMPTS_LIMIT):
        raise ConfigError(
            f"max_crashes must be an int between 1 and {MAX_ATTEMPTS_LIMIT}"
            f", got {shown(max_crashes)}"
        )
    return max_crashes


def check_timeout(timeout: Any) -> float | None:
    """Validate a task timeout: ``None`` or seconds > 0."""
    if timeout is None:
        return None
    return check_seconds("timeout", timeout, allow_zero=False)


def check_unique_key(unique_key: Any) -> str | None:
    """Validate a ``unique_key``: ``None`` or a non-empty storable string."""
    if unique_key is None:
        return None
    if not isinstance(unique_key, str) or not unique_key:
        raise ConfigError(f"unique_key must be a non-empty string or None, got {shown(unique_key)}")
    if len(unique_key) > UNIQUE_KEY_MAX_LENGTH:
        raise ConfigError(
            f"unique_key is {len(unique_key)} characters; the limit is {UNIQUE_KEY_MAX_LENGTH}"
        )
    if "\x00" in unique_key or any("\ud800" <= c <= "\udfff" for c in unique_key):
        raise PayloadError(f"unique_key {unique_key!r} contains a NUL or lone surrogate")
    return plain_str(unique_key)


def check_schedule(delay: Any, run_at: Any) -> tuple[float | None, datetime | None]:
    """Validate ``delay`` (seconds >= 0) and ``run_at`` (an aware datetime).

    A naive ``run_at`` is refused rather than guessed at (arq#184: naive local
    times made delayed jobs run at once). Aware times are converted to UTC.

    Raises:
        ConfigError: both given, a negative/NaN delay or one over ``MAX_DELAY``
            (100 years), or a naive/non-datetime ``run_at`` or one more than
            100 years before or after now.
    """
    if delay is not None and run_at is not None:
        raise ConfigError("give either delay or run_at, not both")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise ConfigError(f"delay must be a number of seconds, got {shown(delay)}")
        if isinstance(delay, int) and abs(delay) > MAX_DELAY:  # also past float's range
            raise ConfigError(f"delay={shown(delay)} seconds is out of range: 0 to {MAX_DELAY:.0f}")
        if not math.isfinite(delay) or delay < 0:
            raise ConfigError(f"delay must be a finite number of seconds >= 0, got {shown(delay)}")
        if delay > MAX_DELAY:
            raise ConfigError(
                f"delay={shown(delay)} seconds is more than the limit of "
                f"{MAX_DELAY:.0f} (100 years)"
            )
        return (float(delay) if delay > 0 else None), None
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise ConfigError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise ConfigError(
                f"run_at={run_at.isoformat()} is a naive datetime; pass an aware one, "
                "e.g. datetime.now(timezone.utc) + timedelta(minutes=10)"
            )
        try:
            utc = run_at.astimezone(UTC)
        except OverflowError:
            raise ConfigError(
                f"run_at={run_at.isoformat()} is out of range once converted to UTC"
            ) from None
        # As far back as ahead: a year-1 run_at would make every queue
        # latency figure read 2,000 years.
        offset = (utc - datetime.now(UTC)).total_seconds()
        if abs(offset) > MAX_DELAY:
            raise ConfigError(
                f"run_at={run_at.isoformat()} is more than 100 years "
                + ("from now" if offset > 0 else "ago")
                + f" ({MAX_DELAY:.0f} seconds, the limit of delay too)"
            )
        return None, utc
    return None, None
