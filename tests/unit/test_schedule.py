"""Schedule: cron and interval ticks, daylight saving as DESIGN.md says, refusals."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobkeeper import ConfigError, Schedule
from jobkeeper.schedule import MAX_EVERY


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local(zone: str, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


# -- daylight saving ---------------------------------------------------------------------------
# Europe/Berlin 2024: 02:00 CET -> 03:00 CEST on 31 March, 03:00 CEST -> 02:00 CET on 27 October.
# America/New_York 2024: 02:00 EST -> 03:00 EDT on 10 March, 02:00 EDT -> 01:00 EST on 3 November.


@pytest.mark.parametrize(
    ("zone", "day", "gap_end"),
    [
        ("Europe/Berlin", (2024, 3, 31), utc(2024, 3, 31, 1, 0)),  # 03:00 CEST
        ("America/New_York", (2024, 3, 10), utc(2024, 3, 10, 7, 0)),  # 03:00 EDT
    ],
)
def test_a_fixed_time_skipped_by_spring_forward_fires_once_after_the_gap(zone, day, gap_end):
    schedule = Schedule("30 2 * * *", timezone=zone)
    noon = local(zone, *day, 12)
    ticks = schedule.ticks_between(noon - timedelta(days=1), noon + timedelta(days=1))
    assert ticks == [gap_end, gap_end + timedelta(hours=23, minutes=30)]  # and 02:30 the next day
    assert gap_end.astimezone(ZoneInfo(zone)).strftime("%H:%M") == "03:00"


@pytest.mark.parametrize(
    ("zone", "expression", "first"),
    [
        ("Europe/Berlin", "30 2 * * *", utc(2024, 10, 27, 0, 30)),  # 02:30 CEST, not CET
        ("America/New_York", "30 1 * * *", utc(2024, 11, 3, 5, 30)),  # 01:30 EDT, not EST
    ],
)
def test_a_fixed_time_repeated_by_fall_back_fires_once_at_its_first_occurrence(
    zone, expression, first
):
    schedule = Schedule(expression, timezone=zone)
    ticks = schedule.ticks_between(first - timedelta(hours=12), first + timedelta(hours=12))
    assert ticks == [first]
    # Asked from inside the repeated hour, the next tick is tomorrow's, not the repeat.
    assert (
        schedule.next_after(first + timedelta(minutes=90)).date()
        == (first + timedelta(days=1)).date()
    )


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
def test_a_daily_job_fires_once_every_day_of_the_year(zone):
    for expression in ("30 2 * * *", "30 1 * * *", "0 3 * * *", "@daily"):
        ticks = Schedule(expression, timezone=zone).ticks_between(utc(2024, 1, 1), utc(2025, 1, 1))
        days = [t.astimezone(ZoneInfo(zone)).date() for t in ticks]
        assert len(days) in (366, 365)  # the first local day may begin before 2024-01-01Z
        assert len(set(days)) == len(days)


def test_an_hourly_wildcard_follows_real_time_across_fall_back():
    ticks = Schedule("30 * * * *", timezone="Europe/Berlin").ticks_between(
        utc(2024, 10, 26, 23), utc(2024, 10, 27, 3)
    )
    # 01:30 CEST, 02:30 CEST, 02:30 CET, 03:30 CET: both 02:30s, an hour apart.
    assert ticks == [
        utc(2024, 10, 26, 23, 30),
        utc(2024, 10, 27, 0, 30),
        utc(2024, 10, 27, 1, 30),
        utc(2024, 10, 27, 2, 30),
    ]


def test_an_hourly_wildcard_follows_real_time_across_spring_forward():
    zone = ZoneInfo("America/New_York")
    ticks = Schedule("30 * * * *", timezone="America/New_York").ticks_between(
        utc(2024, 3, 10, 5), utc(2024, 3, 10, 9)
    )
    walls = [t.astimezone(zone).strftime("%H:%M") for t in ticks]
    assert walls == ["00:30", "01:30", "03:30", "04:30"]  # no 02:30, 03:30 once
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(ticks))


def test_a_step_hour_follows_real_time():
    ticks = Schedule("0 */2 * * *", timezone="Europe/Berlin").ticks_between(
        utc(2024, 10, 26, 21), utc(2024, 10, 27, 4)
    )
    assert ticks == [
        utc(2024, 10, 26, 22),
        utc(2024, 10, 27, 0),
        utc(2024, 10, 27, 1),
        utc(2024, 10, 27, 3),
    ]


def test_two_fixed_times_that_meet_after_the_gap_fire_once():
    ticks = Schedule("0 2,3 * * *", timezone="Europe/Berlin").ticks_between(
        utc(2024, 3, 30, 21), utc(2024, 3, 31, 21)
    )
    assert ticks == [utc(2024, 3, 31, 1)]


def test_a_half_hour_dst_change_lord_howe():
    # Australia/Lord_Howe 2024-10-06: 02:00 +10:30 -> 02:30 +11:00.
    ticks = Schedule("15 2 * * *", timezone="Australia/Lord_Howe").ticks_between(
        utc(2024, 10, 5, 6), utc(2024, 10, 6, 6)
    )
    assert ticks == [local("Australia/Lord_Howe", 2024, 10, 6, 2, 30)]


# -- cron fields ---------------------------------------------------------------------------------


def test_aliases():
    start = utc(2024, 1, 10, 12, 34)  # a Wednesday
    assert Schedule("@hourly").next_after(start) == utc(2024, 1, 10, 13)
    assert Schedule("@daily").next_after(start) == utc(2024, 1, 11)
    assert Schedule("@weekly").next_after(start) == utc(2024, 1, 14)
    assert Schedule("@monthly").next_after(start) == utc(2024, 2, 1)
    assert Schedule("@yearly").next_after(start) == utc(2025, 1, 1)
    assert Schedule("@DAILY") == Schedule("@daily")
    assert Schedule("@daily", timezone="Asia/Tokyo").next_after(start) == utc(2024, 1, 10, 15)


def test_day_of_month_and_day_of_week_both_restricted_means_either():
    # The 13th or any Friday, in January 2024 (Fridays: 5, 12, 19, 26).
    ticks = Schedule("0 0 13 * 5").ticks_between(utc(2024, 1, 1), utc(2024, 2, 1))
    assert [t.day for t in ticks] == [5, 12, 13, 19, 26]
    # One of them a star: both must hold (Fridays only).
    ticks = Schedule("0 0 * * 5").ticks_between(utc(2024, 1, 1), utc(2024, 2, 1))
    assert [t.day for t in ticks] == [5, 12, 19, 26]


def test_next_after_is_strictly_after():
    schedule = Schedule("*/15 * * * *")
    assert schedule.next_after(utc(2024, 1, 1, 10, 15)) == utc(2024, 1, 1, 10, 30)
    assert schedule.next_after(utc(2024, 1, 1, 10, 14, 59, 999999)) == utc(2024, 1, 1, 10, 15)
    assert Schedule(every=30).next_after(utc(2024, 1, 1, 0, 0, 30)) == utc(2024, 1, 1, 0, 1)


def test_ticks_between_excludes_a_and_includes_b():
    schedule = Schedule("0 * * * *")
    assert schedule.ticks_between(utc(2024, 1, 1, 1), utc(2024, 1, 1, 3)) == [
        utc(2024, 1, 1, 2),
        utc(2024, 1, 1, 3),
    ]
    assert schedule.ticks_between(utc(2024, 1, 1, 3), utc(2024, 1, 1, 3)) == []
    assert schedule.ticks_between(utc(2024, 1, 1, 4), utc(2024, 1, 1, 3)) == []
    assert Schedule(every=60).ticks_between(utc(2024, 1, 1, 0, 1), utc(2024, 1, 1, 0, 3)) == [
        utc(2024, 1, 1, 0, 2),
        utc(2024, 1, 1, 0, 3),
    ]


def test_results_are_utc_whatever_the_input_zone():
    berlin = datetime(2024, 6, 1, 12, tzinfo=ZoneInfo("Europe/Berlin"))
    tick = Schedule("0 * * * *", timezone="Europe/Berlin").next_after(berlin)
    assert tick.tzinfo is UTC and tick == utc(2024, 6, 1, 11)


def test_every_is_aligned_to_the_epoch():
    schedule = Schedule(every=30)
    ticks = schedule.ticks_between(utc(2024, 1, 1, 0, 0, 5), utc(2024, 1, 1, 0, 1, 30))
    assert ticks == [utc(2024, 1, 1, 0, 0, 30), utc(2024, 1, 1, 0, 1), utc(2024, 1, 1, 0, 1, 30)]
    epoch = utc(1970, 1, 1)
    for tick in Schedule(every=7).ticks_between(utc(2024, 5, 5), utc(2024, 5, 5, 0, 5)):
        assert (tick - epoch) % timedelta(seconds=7) == timedelta(0)


def test_identity_for_the_periodic_table():
    cron = Schedule("30   2 * * *", timezone="Europe/Berlin")
    assert str(cron) == cron.expression == "30 2 * * *"
    assert cron.timezone == "Europe/Berlin"
    assert cron.key == "30 2 * * * @ Europe/Berlin"
    assert cron != Schedule("30 2 * * *") and cron == Schedule(
        "30 2 * * *", timezone="Europe/Berlin"
    )
    assert repr(cron) == "Schedule('30 2 * * *', timezone='Europe/Berlin')"
    interval = Schedule(every=30.0)
    assert str(interval) == interval.key == "every 30s"
    assert interval.every == 30 and interval.expression is None and interval.timezone == "UTC"
    assert len({cron, Schedule("30 2 * * *", timezone="Europe/Berlin"), interval}) == 2


def test_a_long_range_is_refused_or_iterated_lazily():
    schedule = Schedule(every=1)
    with pytest.raises(ConfigError, match="iter_ticks"):
        schedule.ticks_between(utc(2000, 1, 1), utc(2100, 1, 1))
    with pytest.raises(ConfigError, match="more than 10 ticks"):
        Schedule("* * * * *").ticks_between(utc(2000, 1, 1), utc(2100, 1, 1), limit=10)
    ticks = schedule.iter_ticks(utc(2000, 1, 1))
    assert [next(ticks) for _ in range(3)] == [utc(2000, 1, 1, 0, 0, s) for s in (1, 2, 3)]
    year = Schedule("* * * * *").ticks_between(utc(2023, 1, 1), utc(2024, 1, 1))
    assert len(year) == 525_600


# -- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"cron": "61 * * * *"}, "'61 * * * *'"),
        ({"cron": "* * * *"}, "'* * * *'"),
        ({"cron": "0 * * * * *"}, "'0 * * * * *'"),  # six fields: seconds are not cron
        ({"cron": "@fortnightly"}, "'@fortnightly'"),
        ({"cron": "0 0 31 2 *"}, "'0 0 31 2 *'"),
        ({"cron": ""}, "''"),
        ({"cron": 5}, "5"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "'Mars/Olympus'"),
        ({"cron": "0 3 * * *", "timezone": "../etc/passwd"}, "'../etc/passwd'"),
        ({"cron": "0 3 * * *", "timezone": ""}, "''"),
        ({"every": 0}, "0"),
        ({"every": -5}, "-5"),
        ({"every": math.nan}, "nan"),
        ({"every": math.inf}, "inf"),
        ({"every": True}, "True"),
        ({"every": 1.5}, "1.5"),
        ({"every": "30"}, "'30'"),
        ({"every": MAX_EVERY + 1}, str(MAX_EVERY + 1)),
        ({"every": 10**400}, "1000"),
        ({"every": 30, "timezone": "Europe/Berlin"}, "'Europe/Berlin'"),
        ({"cron": "0 3 * * *", "every": 30}, "not both"),
        ({}, "neither was given"),
    ],
)
def test_invalid_input_is_refused_with_one_line_naming_it(kwargs, named):
    with pytest.raises(ConfigError) as caught:
        Schedule(**kwargs)
    message = str(caught.value)
    assert named in message and "\n" not in message


def test_naive_datetimes_are_refused():
    schedule = Schedule("0 3 * * *")
    naive = datetime(2024, 1, 1)
    with pytest.raises(ConfigError, match="naive 2024-01-01T00:00:00"):
        schedule.next_after(naive)
    with pytest.raises(ConfigError, match=r"^a must be"):
        schedule.ticks_between(naive, utc(2024, 1, 2))
    with pytest.raises(ConfigError, match=r"^b must be"):
        schedule.ticks_between(utc(2024, 1, 1), naive)
    with pytest.raises(ConfigError, match="naive"):
        Schedule(every=5).iter_ticks(naive)


# -- the end of the calendar -------------------------------------------------------------------
# A tick past 9999-12-31T23:59:59.999999Z cannot be a datetime: no tick, a
# ConfigError from next_after, never an OverflowError (raised where the first
# tick, or a wall time's instant, fell past the end).

LAST = datetime.max.replace(tzinfo=UTC)
_END_EXPRESSIONS = ["* * * * *", "30 * * * *", "30 2 * * *", "0 */2 * * *", "59 23 31 12 *"]


@pytest.mark.parametrize(
    ("schedule", "after"),
    [
        (Schedule("30 2 * * *", timezone="Europe/Berlin"), utc(9999, 12, 31, 23)),
        (Schedule(every=1), LAST),
        (Schedule(every=MAX_EVERY), utc(9999, 1, 1)),
        (Schedule("30 * * * *", timezone="America/New_York"), utc(9999, 12, 31, 23, 45)),
        (Schedule("30 2 * * *", timezone="Pacific/Kiritimati"), utc(9999, 12, 31, 23, 45)),
        (Schedule("* * * * *", timezone="Etc/GMT-14"), utc(9999, 12, 31, 23, 58)),
        (Schedule("* * * * *", timezone="Etc/GMT+12"), utc(9999, 12, 31, 23, 59)),
    ],
    ids=repr,
)
def test_no_tick_before_the_end_of_the_calendar_is_a_config_error(schedule, after):
    with pytest.raises(ConfigError, match="has no tick after"):
        schedule.next_after(after)
    assert schedule.ticks_between(after, LAST) == []
    assert list(schedule.iter_ticks(after)) == []


def test_the_last_ticks_of_the_calendar():
    assert Schedule(every=1).ticks_between(utc(9999, 12, 31, 23, 59, 57), LAST) == [
        utc(9999, 12, 31, 23, 59, 58),
        utc(9999, 12, 31, 23, 59, 59),
    ]
    # 12 h behind UTC: walls from noon on the last day have no instant.
    behind = Schedule("* * * * *", timezone="Etc/GMT+12")
    ticks = behind.ticks_between(utc(9999, 12, 31, 11), LAST)
    assert (len(ticks), ticks[0], ticks[-1]) == (
        779,
        utc(9999, 12, 31, 11, 1),
        LAST.replace(second=0, microsecond=0),
    )
    # 14 h ahead: the last day's 02:30 is the 30th's 12:30 UTC, and it is the last.
    ahead = Schedule("30 2 * * *", timezone="Pacific/Kiritimati")
    assert ahead.next_after(utc(9999, 12, 30)) == utc(9999, 12, 30, 12, 30)
    with pytest.raises(ConfigError, match="has no tick after"):
        ahead.next_after(utc(9999, 12, 30, 12, 30))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(_END_EXPRESSIONS),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Etc/GMT+12", "Etc/GMT-14"]),
    st.datetimes(min_value=datetime(9999, 12, 29), timezones=st.just(UTC)),
)
def test_near_the_end_ticks_agree_with_next_after_and_never_overflow(expression, zone, after):
    schedule = Schedule(expression, timezone=zone)
    ticks = schedule.ticks_between(after, LAST)
    assert all(after < t for t in ticks) and all(x < y for x, y in pairwise(ticks))
    previous = after
    for tick in ticks:
        assert schedule.next_after(previous) == tick
        previous = tick
    with pytest.raises(ConfigError, match="has no tick after"):
        schedule.next_after(previous)


# -- properties ------------------------------------------------------------------------------------

EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "30 * * * *",
    "0 */2 * * *",
    "30 2 * * *",
    "30 1 * * *",
    "0,30 1-3 * * *",
    "*/20 2 * * *",
    "0 0 1,15 * 1",
    "15 2 1-7 * 0",
]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
# Instants near the 2024 changes of those zones, and anywhere.
NEAR_CHANGES = [
    utc(2024, 3, 31, 1),
    utc(2024, 10, 27, 1),
    utc(2024, 3, 10, 7),
    utc(2024, 11, 3, 6),
    utc(2024, 4, 6, 15),
    utc(2024, 10, 5, 15),
]
instants = st.one_of(
    st.builds(
        lambda base, seconds: base + timedelta(seconds=seconds),
        st.sampled_from(NEAR_CHANGES),
        st.integers(min_value=-4 * 3600, max_value=4 * 3600),
    ),
    st.datetimes(
        min_value=datetime(1990, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
)
schedules = st.builds(
    Schedule, st.sampled_from(EXPRESSIONS), timezone=st.sampled_from(ZONES)
) | st.builds(
    lambda every: Schedule(every=every), st.sampled_from([1, 7, 30, 3600, 86_400, 1_000_003])
)


@settings(max_examples=300, deadline=None)
@given(schedules, instants, st.integers(min_value=0, max_value=3 * 86_400))
def test_ticks_between_agrees_with_next_after(schedule, a, span):
    b = a + timedelta(seconds=span)
    ticks = schedule.ticks_between(a, b)
    assert all(a < t <= b and t.tzinfo is UTC for t in ticks)
    assert all(x < y for x, y in pairwise(ticks))
    previous = a
    for tick in ticks:
        assert schedule.next_after(previous) == tick
        previous = tick
    assert schedule.next_after(previous) > b


@settings(max_examples=300, deadline=None)
@given(schedules, instants)
def test_next_after_is_later(schedule, dt):
    assert schedule.next_after(dt) > dt


# An independent reading of DESIGN.md's rules, by brute force over every minute.


def _field(text, low, high):
    values = set()
    for part in text.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = map(int, span.split("-"))
        else:
            first = last = int(span)
            if step:
                last = high
        values.update(range(first, last + 1, int(step or 1)))
    return values


def _matches(expression, wall):
    minute, hour, dom, month, dow = expression.split()
    days = _field(dom, 1, 31)
    weekdays = {d % 7 for d in _field(dow, 0, 7)}
    day_ok = wall.day in days, (wall.weekday() + 1) % 7 in weekdays
    either = not dom.startswith("*") and not dow.startswith("*")
    return (
        wall.minute in _field(minute, 0, 59)
        and wall.hour in _field(hour, 0, 23)
        and wall.month in _field(month, 1, 12)
        and (any(day_ok) if either else all(day_ok))
    )


def _oracle(expression, zone_name, a, b):
    zone = ZoneInfo(zone_name)
    hour = expression.split()[1]
    minute = timedelta(minutes=1)
    if "*" in hour or "/" in hour:  # real time: every instant whose wall time matches
        t = a.replace(second=0, microsecond=0) + minute
        found = []
        while t <= b:
            if _matches(expression, t.astimezone(zone).replace(tzinfo=None)):
                found.append(t)
            t += minute
        return found
    found = set()  # wall clock: first occurrence, or the end of the gap
    wall = a.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0) - timedelta(hours=3)
    while wall <= b.astimezone(zone).replace(tzinfo=None) + timedelta(hours=3):
        if _matches(expression, wall):
            t = wall.replace(tzinfo=zone).astimezone(UTC)
            if t.astimezone(zone).replace(tzinfo=None) != wall:  # skipped: walk to the gap's end
                t = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
                while t.astimezone(zone).replace(tzinfo=None) < wall:
                    t += minute
            found.add(t)
        wall += minute
    return sorted(t for t in found if a < t <= b)


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(EXPRESSIONS),
    st.sampled_from(ZONES),
    st.sampled_from(NEAR_CHANGES),
    st.integers(min_value=-6 * 3600, max_value=0),
)
def test_ticks_match_a_brute_force_reading_of_design(expression, zone, change, offset):
    a = change + timedelta(seconds=offset)
    b = a + timedelta(hours=12)
    assert Schedule(expression, timezone=zone).ticks_between(a, b) == _oracle(
        expression, zone, a, b
    )
