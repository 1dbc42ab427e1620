"""encode_result: tuples, at any depth, become JSON arrays; everything else
is refused as before, named by its path (tests/unit/test_payload.py has the
rules results share with args)."""

from __future__ import annotations

import math
import time
from collections import namedtuple
from typing import Any

import pytest

from jobkeeper.errors import PayloadError
from jobkeeper.payload import MAX_DEPTH, encode_args
from jobkeeper.results_json import encode_result

Pair = namedtuple("Pair", "left right")


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ((1, 2), "[1,2]"),
        ((), "[]"),
        (("é", None, True, 2.5), '["é",null,true,2.5]'),
        (((1, (2, (3,))), {"a": (4,)}), '[[1,[2,[3]]],{"a":[4]}]'),
        ([1, (2,)], "[1,[2]]"),
        ({"k": [(1, "a")], "n": 1}, '{"k":[[1,"a"]],"n":1}'),
        (Pair(1, Pair(2, 3)), "[1,[2,3]]"),
    ],
)
def test_tuples_are_stored_as_arrays(value: Any, stored: str) -> None:
    assert encode_result(value, max_bytes=1000) == stored


def test_a_shared_tuple_is_stored_at_each_place() -> None:
    shared = (1,)
    assert encode_result([shared, {"s": shared}, [shared]], max_bytes=100) == (
        '[[1],{"s":[1]},[[1]]]'
    )


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ((1, {2}), r"^result\[1\]: \{2\} is a set"),
        ({"a": [(1.0, math.nan)]}, r"^result\.a\[0\]\[1\]: nan is not a JSON number"),
        ((b"x",), r"^result\[0\]: b'x' is a bytes"),
        (((1,), object()), r"^result\[1\]: <object object .* is an object"),
        (({1: (2,)},), r"^result\[0\]: object key 1 is an int"),
        (("a\x00",), r"^result\[0\]: .* NUL"),
        ({3}, r"^result: \{3\} is a set"),
    ],
)
def test_what_has_no_json_form_is_still_refused(value: Any, refusal: str) -> None:
    with pytest.raises(PayloadError, match=refusal):
        encode_result(value, max_bytes=1000)


def test_size_is_checked_on_the_arrays() -> None:
    with pytest.raises(PayloadError, match=r"^result: encoded size 24 bytes exceeds"):
        encode_result(("x" * 20,), max_bytes=10)
    with pytest.raises(PayloadError, match=r"^result: encoded size 26 bytes exceeds"):
        encode_result([("x" * 20,)], max_bytes=10)


def test_nesting_and_cycles_are_refused_by_path() -> None:
    deep: Any = (1,)
    for _ in range(MAX_DEPTH + 5):
        deep = (deep,)
    with pytest.raises(PayloadError, match=rf"\]: nested deeper than {MAX_DEPTH} levels"):
        encode_result(deep, max_bytes=10_000)
    itself: list[Any] = [(1,)]
    itself.append(itself)
    with pytest.raises(PayloadError, match=r"^result\[1\]: nested deeper .* refers to itself"):
        encode_result(itself, max_bytes=10_000)


def test_shared_containers_are_walked_once() -> None:
    # 2**60 paths through 61 lists: walking each path would never end.
    value: Any = [{1}]
    for _ in range(60):
        value = [value, value, (1,)]
    started = time.monotonic()
    with pytest.raises(PayloadError, match="is a set"):
        encode_result(value, max_bytes=1 << 20)
    assert time.monotonic() - started < 5


def test_args_still_refuse_tuples() -> None:
    with pytest.raises(PayloadError, match=r"^args\.a: \(1, 2\) is a tuple"):
        encode_args({"a": (1, 2)}, max_bytes=1000)
