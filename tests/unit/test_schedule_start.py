"""Schedule near the start of the calendar (year 1), as test_schedule.py
does near its end."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobkeeper import ConfigError, Schedule


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


_EXPRESSIONS = ["* * * * *", "30 * * * *", "30 2 * * *", "0 */2 * * *", "0 0 1 1 *"]

# -- the start of the calendar -----------------------------------------------------------------
# An instant of 0001-01-01 UTC that reads before year 1 in a zone behind UTC
# has no wall time to start from: a ConfigError, as next_after promises,
# never the OverflowError its astimezone raised.

FIRST = datetime.min.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "after"),
    [
        (Schedule("30 2 * * *", timezone="America/New_York"), utc(1, 1, 1, 1)),
        (Schedule("30 * * * *", timezone="America/New_York"), FIRST),
        (Schedule("* * * * *", timezone="Etc/GMT+12"), utc(1, 1, 1, 11, 59)),
        (Schedule("0 0 1 1 *", timezone="Etc/GMT+1"), FIRST),
    ],
    ids=repr,
)
def test_an_instant_before_year_1_on_the_wall_is_a_config_error(schedule, after):
    with pytest.raises(ConfigError, match="reads before year 1"):
        schedule.next_after(after)
    with pytest.raises(ConfigError, match="reads before year 1"):
        schedule.ticks_between(after, utc(1, 1, 3))
    with pytest.raises(ConfigError, match="reads before year 1"):
        next(schedule.iter_ticks(after))


def test_the_first_ticks_of_the_calendar():
    # Once the wall time is in year 1, ticks come as anywhere else.
    behind = Schedule("* * * * *", timezone="Etc/GMT+12")
    assert behind.next_after(utc(1, 1, 1, 12)) == utc(1, 1, 1, 12, 1)
    # Ahead of UTC every instant of the calendar reads a wall in it.
    assert Schedule("30 2 * * *", timezone="Etc/GMT-14").next_after(FIRST) == utc(1, 1, 1, 12, 30)
    assert Schedule(every=60).next_after(FIRST) == utc(1, 1, 1, 0, 1)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(_EXPRESSIONS),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Etc/GMT+12", "Etc/GMT-14"]),
    st.datetimes(max_value=datetime(1, 1, 3), timezones=st.just(UTC)),
)
def test_near_the_start_next_after_gives_a_tick_or_a_config_error(expression, zone, after):
    schedule = Schedule(expression, timezone=zone)
    try:
        tick = schedule.next_after(after)
    except ConfigError as exc:
        assert "reads before year 1" in str(exc) or "has no tick after" in str(exc)
    else:
        assert tick > after
