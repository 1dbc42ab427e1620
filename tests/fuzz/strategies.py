"""Hostile inputs for the fuzz tests, and the helpers they share."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from jobkeeper import JobQueue
from support.db import sql

#: Modest example counts: the fuzz tests run in the normal suite, on both
#: backends, and every example touches the database.
FUZZ = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: The documented name rule (README): 1-200 characters from letters, digits
#: and ``_ . : - /``, the first a letter, digit or ``_``.
NAME_RULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/\-]{0,199}")

NASTY_STRINGS = [
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "'; DROP TABLE jobkeeper_jobs; --",
    '"); DELETE FROM jobkeeper_jobs; --',
    "' OR '1'='1",
    "$1",
    "%s",
    "%(queue)s",
    "{now}",
    "?",
    ":id",
    "\\",
    "\u2028\u2029",
    "héllo ✓ 😀",
    "\t\n\r",
    " ",
    "a" * 200,
    "a" * 201,
    "default\n",
    "~canary:x",
    "*",
]


class HugeInt(int):
    """An int too long for ``str()`` (Python's 4,300-digit limit) that
    hypothesis can still print (through ``_repr_pretty_``; ``repr`` and
    ``str`` stay the int's, and fail like any such int's).
    """

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"HugeInt(<{self.bit_length()} bits>)")


#: Every code point, lone surrogates and NUL included.
any_text = st.text(st.characters(exclude_categories=()), max_size=30) | st.sampled_from(
    NASTY_STRINGS
)
name_text = (
    st.from_regex(NAME_RULE, fullmatch=True)
    | st.text(alphabet="abc_.:/-~ \x00é;'\"*", max_size=12)
    | st.sampled_from(NASTY_STRINGS)
    | st.text(st.characters(exclude_categories=()), max_size=12)
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
not_json = (
    st.tuples(st.integers())
    | st.sets(st.integers(), max_size=2)
    | st.binary(max_size=4)
    | st.just(datetime(2030, 1, 1, tzinfo=UTC))
    | st.just(Decimal("1.5"))
    | st.just(object())
    | st.builds(lambda: HugeInt(10**5000))
    | st.just(float("nan"))
    | st.just(-math.inf)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=12,
)
hostile_values = st.recursive(
    json_scalars | not_json,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(any_text | st.integers() | st.none(), children, max_size=4)
    ),
    max_leaves=12,
)
#: Args: mostly JSON objects, some hostile, some not objects at all.
hostile_args = (
    st.dictionaries(any_text, json_values, max_size=5)
    | st.dictionaries(any_text | st.integers(), hostile_values, max_size=5)
    | hostile_values
)
#: Args that must be accepted: JSON-native, finite, no NUL or lone surrogate.
storable_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
storable_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4)
    ),
    max_leaves=12,
)
storable_args = st.dictionaries(storable_text, storable_values, max_size=5)


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON: everything exactly (``True`` is not ``1``, ``"1"`` is
    not ``1``), except that an int and a float are equal when they are the
    same double: PostgreSQL's jsonb keeps numbers as ``numeric`` and prints
    them without exponent, so the float ``6.768216960898739e+16`` comes back
    as the int ``67682169608987390`` (a known jsonb normalisation; SQLite
    returns the float).
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if type(a) is type(b):
            return a == b
        try:
            return float(a) == float(b)
        except OverflowError:
            return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def row_count(jq: JobQueue) -> int:
    """Rows in both job tables (the tables must still exist: nothing slipped SQL)."""
    live = sql(jq, "SELECT count(*) FROM jobkeeper_jobs")[0][0]
    dead = sql(jq, "SELECT count(*) FROM jobkeeper_dead_letters")[0][0]
    return int(live) + int(dead)
