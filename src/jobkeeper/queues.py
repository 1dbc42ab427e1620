"""Flow control across the fleet: per-queue settings and their parsing.

A queue's settings live in ``jobkeeper_queues`` and every claim reads them in
the database (see the backends' ``job_claim``), so they hold across all
workers at once and through restarts:

* ``paused``: the queue starts nothing new; running jobs finish.
* ``concurrency``: most jobs of the queue held (``claimed`` or ``running``)
  at once on all workers together. Claimed jobs count, so prefetch cannot
  hoard a limited queue; a crashed worker's jobs count until they are
  rescued, then stop counting (a crash never shrinks the queue for good).
* ``rate_limit``: most claims (starts) in any sliding window of the period
  (``"N/s"``, ``"N/m"``, ``"N/h"``) on all workers together.
* ``max_pending``: an enqueue that would take the queue's ``scheduled``,
  ``available``, ``claimed`` and ``retryable`` jobs past it is refused with
  :class:`~jobkeeper.QueueFull`, nothing written.

Oban Pro's ``global_limit``/``rate_limit`` and River's per-queue
concurrency limits are the models; here they are enforced in the claim
statement itself rather than by a leader handing out slots.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from jobkeeper.config import MAX_CONCURRENCY, MAX_DIGITS, check_name, plain_str
from jobkeeper.errors import ConfigError, shown
from jobkeeper.payload import check_text
from jobkeeper.version import __version__, split_worker_version

#: Seconds per rate period unit.
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"(\d+)/([smh])", re.ASCII)
#: Largest count a rate limit or max_pending may name.
MAX_LIMIT = 2**31 - 1
#: The first jobkeeper version whose workers enforce queue settings.
FLOW_CONTROL_SINCE = "0.1.0"
#: Statuses ``max_pending`` counts.
PENDING_STATUSES = ("scheduled", "available", "claimed", "retryable")


class Unset:
    """The type of :data:`UNSET`: a setting not given (left as it is)."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


#: "Leave this setting as it is" in :meth:`jobkeeper.JobQueue.configure_queue`.
UNSET = Unset()


@dataclasses.dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue as :meth:`jobkeeper.JobQueue.queues` reports it.

    Attributes:
        name: the queue's name.
        paused: whether claims of it are stopped.
        concurrency: most jobs held at once across all workers, or None.
        rate_limit: most starts per period as ``"N/s"``, ``"N/m"`` or
            ``"N/h"``, or None.
        max_pending: most pending jobs before enqueues are refused, or None.
        counts: its jobs per status (every status, zeros included; dead
            letters as ``"dead"``), counted as ``JobQueue.queue_counts``
            counts: live statuses exact, finished ones from a recount at
            most a minute old past 100,000 rows.
        estimated: the statuses counted by a recount (``completed``,
            ``cancelled``, ``dead``), sorted; empty when all are exact.
        lower_bound: those of ``estimated`` shown without a recount (see
            ``QueueCounts.lower_bound``): a lower bound; sorted.
    """

    name: str
    paused: bool
    concurrency: int | None
    rate_limit: str | None
    max_pending: int | None
    counts: dict[str, int]
    estimated: tuple[str, ...] = ()
    lower_bound: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The stable JSON form (``queues list --json``): the field names."""
        return {
            **dataclasses.asdict(self),
            "estimated": list(self.estimated),
            "lower_bound": list(self.lower_bound),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class QueueSettings:
    """A row of ``jobkeeper_queues`` (internal: what the backends store).

    ``rate_limit`` starts per ``rate_period`` seconds; ``serial`` is set
    once the queue has had a job with a ``serial_key``.
    """

    name: str
    paused: bool = False
    concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    max_pending: int | None = None
    serial: bool = False

    @property
    def rate_text(self) -> str | None:
        """The rate limit as ``"N/s"``, ``"N/m"`` or ``"N/h"``."""
        if self.rate_limit is None or self.rate_period is None:
            return None
        return format_rate_limit(self.rate_limit, self.rate_period)

    @property
    def limits_claims(self) -> bool:
        """Whether claims of the queue must take the limited path."""
        return (
            self.paused
            or self.concurrency is not None
            or self.rate_limit is not None
            or self.serial
        )

    @property
    def empty(self) -> bool:
        """Nothing set: the row can go."""
        return not self.limits_claims and self.max_pending is None


def parse_rate_limit(value: Any) -> tuple[int, float]:
    """``"100/m"`` -> ``(100, 60.0)``: starts per period seconds.

    Raises:
        ConfigError: not ``N/s``, ``N/m`` or ``N/h`` with 1 <= N < 2**31.
    """
    if not isinstance(value, str):
        raise ConfigError(f"rate_limit must be a string like '100/m', got {shown(value)}")
    match = _RATE.fullmatch(value)
    if match is None:
        raise ConfigError(f"rate_limit {value!r} is invalid: use N/s, N/m or N/h (e.g. '100/m')")
    # int() refuses more than 4,300 digits; no count in range has that many.
    count = int(match.group(1)) if len(match.group(1)) <= MAX_DIGITS else MAX_LIMIT + 1
    if not 1 <= count <= MAX_LIMIT:
        raise ConfigError(f"rate_limit {value!r}: the count must be between 1 and {MAX_LIMIT}")
    return count, RATE_UNITS[match.group(2)]


def format_rate_limit(count: int, period: float) -> str:
    """``(100, 60.0)`` -> ``"100/m"`` (the inverse of :func:`parse_rate_limit`)."""
    for unit, seconds in RATE_UNITS.items():
        if math.isclose(period, seconds):
            return f"{count}/{unit}"
    return f"{count}/{period:g}s"


def check_concurrency(value: Any) -> int:
    """A queue's ``concurrency``: an int from 1 (pause is how to stop a queue)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"concurrency must be an int >= 1 or None, got {shown(value)}")
    if not 1 <= value <= MAX_LIMIT:
        raise ConfigError(
            f"concurrency must be at least 1 (pause the queue to stop it), got {value}"
            if value < 1
            else f"concurrency must be at most {MAX_LIMIT}, got {value}"
        )
    return value


#: Largest ``max_pending``: more than any table holds, within a BIGINT.
MAX_PENDING_LIMIT = 2**62


def check_max_pending(value: Any) -> int:
    """A queue's ``max_pending``: an int from 0 to ``MAX_PENDING_LIMIT``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"max_pending must be an int >= 0 or None, got {shown(value)}")
    if not 0 <= value <= MAX_PENDING_LIMIT:
        raise ConfigError(
            f"max_pending must be between 0 and {MAX_PENDING_LIMIT} (or None), got {value}"
        )
    return value


#: Most bytes of a ``serial_key`` in UTF-8: with a queue name at its longest
#: (200 ASCII characters), an entry of PostgreSQL's serial-key indexes stays
#: under its 2,704-byte limit (950 CJK characters, 2,850 bytes, failed
#: there, as "unavailable", while SQLite took them).
SERIAL_KEY_MAX_BYTES = 2000


def check_serial_key(value: Any) -> str | None:
    """A ``serial_key``: ``None`` or a non-empty string of at most 1,000
    characters and ``SERIAL_KEY_MAX_BYTES`` bytes in UTF-8, without NUL or
    lone surrogates.

    Raises:
        ConfigError: not a string, empty or too long.
        PayloadError: it holds a NUL or a lone surrogate (named, as in args).
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 1000:
        raise ConfigError(
            f"serial_key must be a non-empty string of at most 1000 characters, got {value!r:.80}"
        )
    # NUL and lone surrogates: the same check as args' strings (a lone
    # surrogate once reached the driver and failed there, unnamed).
    key = plain_str(check_text(value, "serial_key"))
    size = len(key.encode("utf-8"))
    if size > SERIAL_KEY_MAX_BYTES:
        raise ConfigError(
            f"serial_key is {size} bytes in UTF-8 ({len(key)} characters); the limit is "
            f"{SERIAL_KEY_MAX_BYTES} bytes, got {key!r:.40}"
        )
    return key


def parse_queue_share(text: str) -> tuple[str, int | None]:
    """One ``--queue`` value: ``"emails"`` or ``"emails=5"`` (this worker runs
    at most 5 of its jobs at once). ``=`` because a colon is legal in queue
    names.

    Raises:
        ConfigError: a bad queue name or share.
    """
    if not isinstance(text, str):
        raise ConfigError(f"queue must be a name string, got {type(text).__name__} {shown(text)}")
    name, sep, share = text.rpartition("=") if "=" in text else (text, "", "")
    try:
        check_name("queue", name)
    except ConfigError as exc:
        raise ConfigError(f"--queue {text!r}: {exc}") from None
    if not sep:
        return name, None
    # int() alone would take " 5", "+5" and "5_0".
    if not share.isascii() or not share.isdigit():
        raise ConfigError(
            f"--queue {text!r}: the share after '=' must be a whole number >= 1, got {shown(share)}"
        )
    count = int(share)
    if not 1 <= count <= MAX_CONCURRENCY:
        raise ConfigError(
            f"--queue {text!r}: the share must be between 1 and {MAX_CONCURRENCY}, got {count}"
        )
    return name, count


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"0.1.0"`` or a worker's ``"0.1.0 (schema 17)"`` -> ``(0, 1, 0)``;
    None for no version or an unreadable one.
    """
    # The release alone: the schema's number read as a part of it made
    # "1.2 (schema 17)" (1, 2, 17).
    release, _ = split_worker_version(version)
    if not release:
        return None
    parts = re.findall(r"\d+", release.split("+")[0])
    return tuple(int(p) for p in parts[:3]) if parts else None


def enforces_queue_settings(version: str | None) -> bool:
    """Whether a worker of ``version`` obeys ``jobkeeper_queues`` (None: a
    worker from before versions were recorded, which does not).
    """
    have = version_tuple(version)
    since = version_tuple(FLOW_CONTROL_SINCE)
    return have is not None and since is not None and have >= since


#: This package's version, as workers record it.
VERSION = __version__
