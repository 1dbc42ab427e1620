"""When periodic jobs fire: cron expressions in a time zone, or fixed intervals.

Pure: no database, no clock. A :class:`Schedule` answers two questions, both
in aware UTC datetimes: the next tick strictly after an instant
(:meth:`Schedule.next_after`), and every tick in a half-open range
(:meth:`Schedule.ticks_between`). The periodic enqueuer stores
``str(schedule)`` and :attr:`Schedule.timezone` in ``jobkeeper_periodic`` and
compares :attr:`Schedule.key` to notice a changed schedule.

Cron fields are parsed by `cronsim <https://github.com/cuu508/cronsim>`_ (the
Healthchecks.io parser), which is used only to walk naive local wall-clock
times; mapping wall times to instants across daylight-saving changes is done
here, by the rules of DESIGN.md, which follow ISC (Vixie) cron:

* An hour field that is neither ``*`` nor a step (``*/2``, ``1-23/2``) is a
  *fixed-hour* schedule and follows the wall clock. A wall time skipped by a
  spring-forward gap fires once, at the first instant after the gap (02:30 in
  Europe/Berlin on the last Sunday of March fires at 03:00 CEST). A wall time
  repeated by a fall-back fires once, at its first occurrence (02:30 CEST, not
  02:30 CET). ISC cron's ``cron.c`` runs skipped fixed-time jobs at once after
  the jump and does not run them again when the clock goes back.
* An hour field of ``*`` or a step follows real time: every instant whose wall
  time matches fires once; a skipped wall time simply does not occur and a
  repeated one occurs twice (``30 * * * *`` fires at both 02:30s of a
  fall-back night and has no 02:30 on a spring-forward night). ISC cron
  treats its "wildcard" jobs the same way. Unlike ISC cron, a ``*`` minute
  field with a fixed hour (``* 2 * * *``) still counts as fixed-hour here:
  DESIGN.md classifies by the hour field alone.

Interval schedules (``every=N``) tick at whole multiples of ``N`` seconds
since the Unix epoch, so every process computes the same ticks; time zones do
not apply to them.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from jobkeeper.errors import ConfigError

__all__ = ["MAX_EVERY", "MAX_TICKS", "Schedule"]

#: Longest accepted interval: 100 years, in seconds.
MAX_EVERY = 100 * 366 * 86_400
#: Most ticks :meth:`Schedule.ticks_between` returns in one list (two years of
#: ``* * * * *``); longer ranges go through :meth:`Schedule.iter_ticks`.
MAX_TICKS = 1_100_000

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)
_EXPRESSION_MAX_LENGTH = 200
_WHITESPACE = re.compile(r"\s+")


class Schedule:
    """A periodic schedule: a cron expression in a time zone, or an interval.

    ``Schedule("30 2 * * *", timezone="Europe/Berlin")`` or ``Schedule(every=30)``.
    Immutable, hashable, and equal to another schedule with the same :attr:`key`.

    Args:
        cron: five fields (minute hour day-of-month month day-of-week, with
            ``*``, lists, ranges, steps, month and day names, and cronsim's
            ``L``, ``LW`` and ``#n``) or one of ``@hourly``, ``@daily``
            (``@midnight``), ``@weekly``, ``@monthly``, ``@yearly``
            (``@annually``). When day-of-month and day-of-week are both
            restricted (neither starts with ``*``), a day matching either
            matches, as in cron.
        timezone: IANA time-zone name (``"Europe/Berlin"``) or a
            :class:`zoneinfo.ZoneInfo`, in which the cron fields are read.
            Default ``"UTC"``. Only for cron schedules.
        every: interval in whole seconds, 1 to :data:`MAX_EVERY`; ticks fall
            on multiples of it since 1970-01-01T00:00:00Z.

    Raises:
        ConfigError: both or neither of ``cron`` and ``every``; an invalid
            expression, time zone or interval; a ``timezone`` with ``every``.
            The message names the input.
    """

    __slots__ = ("_every", "_expression", "_fields", "_real_time", "_zone")

    def __init__(
        self,
        cron: str | None = None,
        *,
        timezone: str | ZoneInfo = "UTC",
        every: int | float | None = None,
    ) -> None:
        if cron is not None and every is not None:
            raise ConfigError("a Schedule takes either a cron expression or every=, not both")
        if cron is None and every is None:
            raise ConfigError("a Schedule needs a cron expression or every=, and neither was given")
        self._every: timedelta | None = None
        self._expression: str | None = None
        self._fields = ""
        self._real_time = False
        self._zone = _zone(timezone)
        if every is not None:
            if self._zone.key != "UTC":
                raise ConfigError(
                    f"timezone={self._zone.key!r} applies to cron schedules, not every="
                    " (intervals are aligned to the Unix epoch)"
                )
            self._every = timedelta(seconds=_seconds(every))
        else:
            self._expression, self._fields = _parse_cron(cron)
            hour = self._fields.split()[1]
            # DESIGN.md: a "*" or step hour field follows real time, any other hour
            # field the wall clock (see the module docstring).
            self._real_time = "*" in hour or "/" in hour

    # -- identity ------------------------------------------------------------------------------

    @property
    def expression(self) -> str | None:
        """The cron expression, whitespace-normalised (aliases lower-case); None for intervals."""
        return self._expression

    @property
    def every(self) -> int | None:
        """The interval in seconds; None for cron schedules."""
        return None if self._every is None else int(self._every.total_seconds())

    @property
    def timezone(self) -> str:
        """The IANA name of the time zone the cron fields are read in (``"UTC"`` for intervals)."""
        return self._zone.key

    @property
    def key(self) -> str:
        """A stable text identity: ``"30 2 * * * @ Europe/Berlin"`` or ``"every 30s"``.

        Two schedules with the same key have the same ticks; a periodic whose
        stored key differs from its code's has been changed.
        """
        return f"{self} @ {self.timezone}" if self._expression is not None else str(self)

    def __str__(self) -> str:
        """The schedule without its time zone: the cron expression, or ``"every 30s"``."""
        return self._expression if self._expression is not None else f"every {self.every}s"

    def __repr__(self) -> str:
        if self._expression is None:
            return f"Schedule(every={self.every})"
        return f"Schedule({self._expression!r}, timezone={self.timezone!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    # -- ticks ---------------------------------------------------------------------------------

    def next_after(self, dt: datetime) -> datetime:
        """The first tick strictly after ``dt``.

        Args:
            dt: an aware datetime, in any time zone.

        Returns:
            The tick, an aware datetime in UTC.

        Raises:
            ConfigError: ``dt`` is naive, or no tick exists before year 9999,
                or ``dt`` reads before year 1 in the schedule's time zone.
        """
        for tick in self._ticks(_aware(dt, "dt")):
            return tick
        raise ConfigError(f"schedule {self.key!r} has no tick after {dt.isoformat()}")

    def ticks_between(self, a: datetime, b: datetime, *, limit: int = MAX_TICKS) -> list[datetime]:
        """Every tick ``t`` with ``a < t <= b``, oldest first.

        Args:
            a: aware datetime, excluded.
            b: aware datetime, included; ``b <= a`` gives ``[]``.
            limit: most ticks to return (default :data:`MAX_TICKS`); for
                longer ranges iterate :meth:`iter_ticks`, which is lazy.

        Returns:
            Aware datetimes in UTC, strictly increasing.

        Raises:
            ConfigError: ``a`` or ``b`` is naive, or the range holds more than
                ``limit`` ticks (nothing is returned then), or ``a`` reads
                before year 1 in the schedule's time zone.
        """
        start, end = _aware(a, "a"), _aware(b, "b")
        ticks: list[datetime] = []
        # Intervals: the count is known before any tick is built.
        every = self._every
        if every is not None and (end - _EPOCH) // every - (start - _EPOCH) // every > limit:
            raise ConfigError(self._too_many(a, b, limit))
        for tick in self._ticks(start):
            if tick > end:
                break
            if len(ticks) == limit:
                raise ConfigError(self._too_many(a, b, limit))
            ticks.append(tick)
        return ticks

    def iter_ticks(self, after: datetime) -> Iterator[datetime]:
        """Every tick strictly after ``after``, oldest first, lazily and without end.

        Args:
            after: an aware datetime, excluded.

        Yields:
            Aware datetimes in UTC, strictly increasing; the iteration stops
            only near year 9999.

        Raises:
            ConfigError: ``after`` is naive (raised at once, not on first
                use); on first use, ``after`` reads before year 1 in the
                schedule's time zone.
        """
        return self._ticks(_aware(after, "after"))

    def _ticks(self, after: datetime) -> Iterator[datetime]:
        start = after.astimezone(UTC)
        if self._every is not None:
            return _interval_ticks(self._every, start)
        if self._real_time:
            return _real_time_ticks(self._fields, self._zone, start)
        return _wall_clock_ticks(self._fields, self._zone, start)

    def _too_many(self, a: datetime, b: datetime, limit: int) -> str:
        return (
            f"schedule {self.key!r} has more than {limit} ticks between {a.isoformat()}"
            f" and {b.isoformat()}: iterate Schedule.iter_ticks() instead"
        )


# -- validation ----------------------------------------------------------------------------------


def _zone(timezone: object) -> ZoneInfo:
    if isinstance(timezone, ZoneInfo):
        if not timezone.key:
            raise ConfigError(f"timezone must be a named IANA zone, got {timezone!r}")
        return timezone
    if not isinstance(timezone, str) or not timezone or len(timezone) > 100:
        raise ConfigError(f"timezone must be an IANA time-zone name, got {timezone!r}")
    try:
        return ZoneInfo(timezone)
    except (ValueError, OSError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        raise ConfigError(
            f"unknown time zone {timezone!r} (an IANA name like 'Europe/Berlin')"
        ) from None


def _seconds(every: object) -> int:
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise ConfigError(f"every must be a number of seconds, got {every!r}")
    # The range check comes first: float() of a huge int would overflow.
    if not 1 <= every <= MAX_EVERY or not math.isfinite(every) or every != int(every):
        raise ConfigError(
            f"every must be a whole number of seconds from 1 to {MAX_EVERY}, got {every!r}"
        )
    return int(every)


def _parse_cron(cron: object) -> tuple[str, str]:
    """(normalised expression, the five fields it stands for)."""
    if not isinstance(cron, str):
        raise ConfigError(f"cron expression must be a string, got {cron!r}")
    expression = _WHITESPACE.sub(" ", cron.strip())
    if expression.startswith("@"):
        expression = expression.lower()
        if expression not in _ALIASES:
            raise ConfigError(
                f"invalid cron expression {cron!r}: unknown alias (known: {', '.join(_ALIASES)})"
            )
        return expression, _ALIASES[expression]
    if len(expression) > _EXPRESSION_MAX_LENGTH or len(expression.split(" ")) != 5:
        raise ConfigError(
            f"invalid cron expression {cron!r}: needs five fields"
            " (minute hour day-of-month month day-of-week) or an @alias"
        )
    try:
        CronSim(expression, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ConfigError(f"invalid cron expression {cron!r}: {exc}") from None
    return expression, expression


def _aware(dt: object, name: str) -> datetime:
    if not isinstance(dt, datetime):
        raise ConfigError(f"{name} must be an aware datetime, got {dt!r}")
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ConfigError(f"{name} must be an aware datetime, got naive {dt.isoformat()}")
    return dt


# -- tick generators -----------------------------------------------------------------------------


def _interval_ticks(every: timedelta, after: datetime) -> Iterator[datetime]:
    try:
        # timedelta // timedelta is exact integer arithmetic on microseconds;
        # the first tick, too, may lie past year 9999.
        tick = _EPOCH + ((after - _EPOCH) // every + 1) * every
        while True:
            yield tick
            tick += every
    except OverflowError:
        return


def _walls(fields: str, after: datetime) -> Iterator[datetime]:
    """Naive wall times matching ``fields``, strictly after naive ``after``."""
    try:
        yield from CronSim(fields, after)
    except OverflowError:  # past year 9999
        return


def _instant(wall: datetime, zone: tzinfo, fold: int) -> datetime:
    """The instant ``wall`` reads in ``zone`` (``fold``: its first or second
    occurrence).

    Raises:
        OverflowError: the instant is past year 9999 (a wall of the last
            hours of 9999 in a zone behind UTC).
    """
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def _wall_of(instant: datetime, zone: tzinfo) -> datetime | None:
    """The naive wall time ``instant`` reads in ``zone``; None when that is
    past year 9999 (a zone ahead of UTC on the last day): no wall is later.

    Raises:
        ConfigError: the wall time is before year 1 (a zone behind UTC on
            the calendar's first day), where no tick can be computed from.
    """
    try:
        return instant.astimezone(zone).replace(tzinfo=None)
    except OverflowError:
        if instant.year < datetime.max.year:
            # An OverflowError out of next_after, whose contract is ConfigError.
            raise ConfigError(
                f"no tick can be computed after {instant.isoformat()}: in {zone} it reads "
                "before year 1, the first the calendar holds"
            ) from None
        return None


def _exists(wall: datetime, instant: datetime, zone: tzinfo) -> bool:
    return instant.astimezone(zone).replace(tzinfo=None) == wall


def _gap_end(wall: datetime, zone: tzinfo) -> datetime:
    """The first instant after the spring-forward gap that swallows ``wall``.

    ``fold=1`` reads a skipped wall time with the offset after the change and
    ``fold=0`` with the one before (PEP 495), so the change lies between the
    two readings; bisect on whole seconds (transitions fall on them).
    """
    low, high = _instant(wall, zone, 1), _instant(wall, zone, 0)
    before = low.astimezone(zone).utcoffset()
    while high - low > _ONE_SECOND:
        middle = low + (high - low) // 2
        middle -= timedelta(microseconds=middle.microsecond)
        if middle <= low:
            break
        if middle.astimezone(zone).utcoffset() == before:
            low = middle
        else:
            high = middle
    return high


def _wall_clock_ticks(fields: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Fixed-hour schedules: each matching wall time fires once, at its first
    occurrence, or at the end of the gap that skips it.

    That map is non-decreasing in wall time, so walls at or before the wall
    reading of ``after`` map to ticks at or before ``after``: start there.
    """
    utc = zone.key == "UTC"
    last = after
    start = _wall_of(after, zone)
    if start is None:
        return
    for wall in _walls(fields, start):
        if utc:
            tick = wall.replace(tzinfo=UTC)
        else:
            try:
                tick = _instant(wall, zone, 0)
                if not _exists(wall, tick, zone):
                    tick = _gap_end(wall, zone)
            except OverflowError:  # this wall and every later one is past year 9999
                return
        if tick > last:  # gap walls share one tick; a fall-back may repeat earlier ones
            last = tick
            yield tick


def _real_time_ticks(fields: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """``*``/step-hour schedules: every instant whose wall time matches, once.

    The instants are the first occurrences (``fold=0``) of matching walls,
    increasing with the wall, plus the second occurrences (``fold=1``) of
    walls a fall-back repeats, which come later than the walls that produce
    them. Those wait in a small heap until the first occurrences pass them.
    """
    if zone.key == "UTC":
        for wall in _walls(fields, after.replace(tzinfo=None)):
            yield wall.replace(tzinfo=UTC)
        return
    start = _wall_of(after, zone)
    if start is None:
        return
    later: list[datetime] = []
    try:
        # When ``after`` reads a repeated wall time for the first time, the
        # second occurrences of walls up to one fold earlier are still ahead:
        # look back.
        lookback = _instant(start, zone, 1) - _instant(start, zone, 0)
        for wall in _walls(fields, start - lookback):
            first = _instant(wall, zone, 0)
            if not _exists(wall, first, zone):
                continue  # skipped by a spring-forward: no instant reads it
            while later and later[0] < first:
                tick = heapq.heappop(later)
                if tick > after:
                    yield tick
            if first > after:
                yield first
            second = _instant(wall, zone, 1)
            if second != first:
                heapq.heappush(later, second)
    except OverflowError:
        pass  # an instant past year 9999: no later wall has an earlier one
    # Second occurrences still waiting when the walls ran out.
    while later:
        tick = heapq.heappop(later)
        if tick > after:
            yield tick
