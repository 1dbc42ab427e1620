"""The worker's array literals (backends/postgres/arrays.py) read back by
PostgreSQL as the values they were built from: any text a worker id or a
result can hold, NULLs, and ints of every size the columns take.
"""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobkeeper.backends.postgres.arrays import int_array, text_array
from support.db import PG_URL

# PostgreSQL text holds any character but NUL (and no lone surrogates: UTF-8).
texts = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=12)


@pytest.fixture(scope="module")
def conn():
    with psycopg.connect(PG_URL, autocommit=True) as connection:
        yield connection


@given(st.lists(texts | st.none(), max_size=8) | st.lists(texts, max_size=1).map(lambda v: v * 5))
@settings(max_examples=300, deadline=None)
def test_text_arrays_read_back_as_written(conn, values):
    row = conn.execute("SELECT %s::text[]", [text_array(values)]).fetchone()
    assert row is not None and row[0] == values


@pytest.mark.parametrize(
    "values",
    [
        ['a"b', "c\\d", "NULL", "", " x ", "{,}", "\\\"'"],
        [None, None, None],
        ['{"ok":true,"n":[1,2]}', None, '"quoted"', "[]"],
    ],
)
def test_quotes_backslashes_and_the_word_null_survive(conn, values):
    row = conn.execute("SELECT %s::text[]", [text_array(values)]).fetchone()
    assert row is not None and row[0] == values


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=10))
@settings(max_examples=200, deadline=None)
def test_int_arrays_read_back_as_written(conn, values):
    row = conn.execute("SELECT %s::bigint[]", [int_array(values)]).fetchone()
    assert row is not None and row[0] == values
