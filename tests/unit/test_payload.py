"""Payload validation and canonical encoding (NaN/Infinity, NUL and lone surrogates, clean_text)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
import sys
import uuid
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobkeeper import payload
from jobkeeper.errors import PayloadError
from jobkeeper.payload import (
    MAX_DEPTH,
    check_json_value,
    clean_text,
    decode_args,
    dumps,
    encode_args,
)
from jobkeeper.results_json import encode_result

MiB = 1 << 20


@pytest.fixture(autouse=True, params=["orjson", "json"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs twice: with the ``fast`` extra's orjson path
    (the dev install has it: its absence fails, never skips) and without.
    """
    if request.param == "json":
        monkeypatch.setattr(payload, "_orjson_dumps", None)
    else:
        assert payload._orjson_dumps is not None, "orjson missing: pip install -e '.[dev]'"
    return str(request.param)


# -- strategies -----------------------------------------------------------------

#: Storable text: anything but NUL (surrogates are excluded by default).
storable_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)))
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(storable_text, children, max_size=5)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(storable_text, json_values, max_size=8)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf, float("-nan")])


def same(a: Any, b: Any) -> bool:
    """Equality that also tells 1 / 1.0 / True and 0.0 / -0.0 apart."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def bury(value: Any, segments: list[str | int]) -> tuple[dict[str, Any], str]:
    """Put ``value`` at ``segments`` inside valid siblings; return (args, expected path).

    The first segment is a key (args are an object); list indexes are padded
    with valid values before the buried one.
    """
    path = "args"
    for segment in segments:
        path += f"[{segment}]" if isinstance(segment, int) else f".{segment}"
    for segment in reversed(segments):
        if isinstance(segment, int):
            value = [0, "ok", None, 1.5, True][:segment] + [0] * max(0, segment - 5) + [value, 7]
        else:
            value = {"before": 1, segment: value, "zafter": [1.0]}
    assert isinstance(value, dict)
    return value, path


path_segments = st.tuples(
    identifiers,
    st.lists(identifiers | st.integers(min_value=0, max_value=6), max_size=12),
).map(lambda t: [t[0], *t[1]])


# -- round trips ------------------------------------------------------------------


@given(json_objects)
def test_any_json_native_dict_round_trips_exactly(args):
    text = encode_args(args, max_bytes=256 * MiB)
    decoded = json.loads(text)
    assert same(decoded, args)
    # Canonical: compact UTF-8 (not ASCII-escaped), and encoding the decoded
    # value gives the same text.
    assert text == json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    assert encode_args(decoded, max_bytes=256 * MiB) == text
    assert decode_args(text) == (decoded, None)


def test_valid_unicode_round_trips_byte_for_byte():
    args = {"s": "héllo ✓ 😀 \u2028 \u2029 \U0010fffd", "ключ": "値"}
    text = encode_args(args, max_bytes=MiB)
    assert json.loads(text) == args
    assert text.encode("utf-8").decode("utf-8") == text
    assert "\\u" not in text  # stored as characters, not escapes


def test_big_ints_and_negative_zero_keep_their_type():
    args = {"big": 2**80, "neg0": -0.0, "one": 1, "onef": 1.0, "t": True}
    assert same(json.loads(encode_args(args, max_bytes=MiB)), args)


# -- NaN / Infinity are refused ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "path", "shown"),
    [
        ({"x": math.nan}, "args.x", "nan"),
        ({"x": math.inf}, "args.x", "inf"),
        ({"x": -math.inf}, "args.x", "-inf"),
        ({"a": [1, {"b": math.nan}]}, "args.a[1].b", "nan"),
        ({"a": {"b": {"c": [[0, -math.inf]]}}}, "args.a.b.c[0][1]", "-inf"),
        ({"odd key": math.inf}, "args['odd key']", "inf"),
    ],
)
def test_non_finite_numbers_are_refused_naming_path_and_value(args, path, shown):
    with pytest.raises(PayloadError) as info:
        encode_args(args, max_bytes=MiB)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert shown in message
    assert "\n" not in message


@given(non_finite, path_segments)
@example(math.nan, ["a", 1, "b"])
def test_non_finite_anywhere_is_refused_naming_its_path(bad, segments):
    args, path = bury(bad, segments)
    with pytest.raises(PayloadError) as info:
        encode_args(args, max_bytes=256 * MiB)
    assert str(info.value).startswith(f"{path}: ")


# -- NUL and lone surrogates are refused ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "path", "kind"),
    [
        ({"s": "a\x00b"}, "args.s", "NUL"),
        ({"s": "\ud800"}, "args.s", "surrogate"),
        ({"s": "ok \udfff tail"}, "args.s", "surrogate"),
        ({"a\x00": 1}, "args", "NUL"),
        ({"\udc80": 1}, "args", "surrogate"),
        ({"l": ["fine", {"deep\x00key": 1}]}, "args.l[1]", "NUL"),
        ({"l": ["fine", ["x\ud83dy"]]}, "args.l[1][0]", "surrogate"),
    ],
)
def test_nul_and_lone_surrogates_are_refused_naming_the_field(args, path, kind):
    with pytest.raises(PayloadError) as info:
        encode_args(args, max_bytes=MiB)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert kind in message


@given(
    st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"]),
    path_segments,
    storable_text,
    storable_text,
)
def test_unstorable_character_anywhere_in_a_string_is_refused(char, segments, head, tail):
    args, path = bury(head + char + tail, segments)
    with pytest.raises(PayloadError) as info:
        encode_args(args, max_bytes=256 * MiB)
    assert str(info.value).startswith(f"{path}: ")


# -- non-JSON types --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "path", "type_name"),
    [
        ({1: "x"}, "args", "int"),
        ({None: "x"}, "args", "NoneType"),
        ({("a",): "x"}, "args", "tuple"),
        ({"t": (1, 2)}, "args.t", "tuple"),
        ({"s": {1, 2}}, "args.s", "set"),
        ({"f": frozenset()}, "args.f", "frozenset"),
        ({"b": b"bytes"}, "args.b", "bytes"),
        ({"b": bytearray(b"x")}, "args.b", "bytearray"),
        ({"d": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)}, "args.d", "datetime"),
        ({"d": dt.date(2024, 1, 1)}, "args.d", "date"),
        ({"d": decimal.Decimal("1.5")}, "args.d", "Decimal"),
        ({"u": uuid.UUID(int=1)}, "args.u", "UUID"),
        ({"o": object()}, "args.o", "object"),
        ({"n": [1, {"deep": complex(1, 2)}]}, "args.n[1].deep", "complex"),
    ],
)
def test_non_json_types_are_refused_not_converted(args, path, type_name):
    with pytest.raises(PayloadError) as info:
        encode_args(args, max_bytes=MiB)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert type_name in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({1: "x"}, "args: object key 1 is an int; JSON object keys must be strings"),
        ({"a": {(1,): 0}}, "args.a: object key (1,) is a tuple; JSON object keys must be strings"),
        ({"o": object()}, "is an object, not a JSON value"),
        ({"t": (1, 2)}, "args.t: (1, 2) is a tuple, not a JSON value"),
    ],
)
def test_type_refusals_read_as_english(args, message):
    # A newcomer saw "object key 1 is a int".
    with pytest.raises(PayloadError, match=re.escape(message)):
        encode_args(args, max_bytes=MiB)


@pytest.mark.parametrize("args", [[1], "x", 1, None, (("a", 1),), json.dumps({"a": 1})])
def test_args_must_be_a_dict(args):
    with pytest.raises(PayloadError, match=r"^args: must be a JSON object"):
        encode_args(args, max_bytes=MiB)


# -- depth and self-reference -------------------------------------------------------------


def nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return {"x": value}


def test_nesting_up_to_the_limit_is_accepted():
    # args itself is depth 0; {"x": [[...1]]} with MAX_DEPTH - 1 lists reaches MAX_DEPTH.
    text = encode_args(nested(MAX_DEPTH - 1), max_bytes=MiB)
    assert json.loads(text) == nested(MAX_DEPTH - 1)


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, 5_000, 100_000])
def test_too_deep_nesting_is_refused_without_recursion_error(depth):
    with pytest.raises(PayloadError, match="nested deeper than"):
        encode_args(nested(depth), max_bytes=256 * MiB)


def test_self_reference_is_refused():
    loop: dict[str, Any] = {"a": 1}
    loop["me"] = loop
    with pytest.raises(PayloadError, match="refers to itself"):
        encode_args(loop, max_bytes=MiB)
    items: list[Any] = []
    items.append(items)
    with pytest.raises(PayloadError, match=r"^args\.l(\[0\])+: nested deeper"):
        encode_args({"l": items}, max_bytes=MiB)


def test_encoding_reuses_one_c_encoder_on_cpython():
    # Made once at import (JSONEncoder.encode makes one per call); a
    # self-reference, which it does not check, is still refused (above).
    if sys.implementation.name == "cpython":
        assert payload._C_ENCODER is not None
    assert payload._dumps_fast({"a": [1.5, "é"]}) == dumps({"a": [1.5, "é"]})


def test_orjson_writes_dumps_text_for_every_code_point():
    # The orjson path serves dicts of str/int/bool/None: its text must be
    # dumps' byte for byte, escapes included, or stored args would differ
    # with the extra installed.
    import orjson

    assert {str, int, bool, type(None)} == payload._ORJSON_SCALARS
    chunk = 4096
    for start in range(0, 0x110000, chunk):
        text = "".join(
            chr(cp) for cp in range(start, start + chunk) if cp and not 0xD800 <= cp <= 0xDFFF
        )
        args = {
            text[:64]: text,
            "n": start,
            "big": 2**64 - 1,
            "neg": -(2**63),
            "f": False,
            "z": None,
        }
        assert orjson.dumps(args).decode() == dumps(args)
        assert payload.encode_checked(args, "args", 256 * MiB) == dumps(args)


@given(
    st.dictionaries(
        storable_text,
        st.none() | st.booleans() | st.integers() | storable_text,
        max_size=8,
    )
)
@settings(max_examples=200)
def test_flat_args_encode_to_the_same_text_either_way(args):
    assert encode_args(args, max_bytes=256 * MiB) == dumps(args)


# -- size limit -----------------------------------------------------------------------------


@given(json_objects)
@settings(max_examples=40)
def test_size_limit_is_exact_in_utf8_bytes(args):
    size = len(dumps(args).encode("utf-8"))
    assert encode_args(args, max_bytes=size) == dumps(args)
    if size > 1:
        with pytest.raises(PayloadError) as info:
            encode_args(args, max_bytes=size - 1)
        message = str(info.value)
        assert f"{size} bytes" in message
        assert f"max_payload_bytes={size - 1}" in message


@pytest.mark.parametrize(
    "args",
    [{}, {"a": 1}, {"s": "é"}, {"s": "\U0001f600"}, {"l": [1, {"b": "ü"}]}],
    ids=["empty", "ascii", "two-byte", "four-byte", "nested"],
)
def test_size_limit_holds_on_every_fast_path(args):
    # The empty object, ASCII text (measured in characters) and other text
    # (measured encoded) are each sized on a path of their own.
    size = len(dumps(args).encode("utf-8"))
    assert encode_args(args, max_bytes=size) == dumps(args)
    with pytest.raises(PayloadError, match=f"encoded size {size} bytes"):
        encode_args(args, max_bytes=size - 1)


def test_size_error_names_size_and_limit():
    args = {"s": "é" * 600}  # 1200 bytes of text, 600 characters
    with pytest.raises(PayloadError) as info:
        encode_args(args, max_bytes=1000)
    message = str(info.value)
    assert re.search(r"\b1208 bytes\b", message), message
    assert "max_payload_bytes=1000" in message


# -- results and generic values -------------------------------------------------------------


def test_encode_result_validates_like_args_but_allows_any_json_value():
    assert encode_result(None, max_bytes=10) is None
    assert encode_result([1, "a"], max_bytes=100) == '[1,"a"]'
    assert encode_result("x", max_bytes=100) == '"x"'
    with pytest.raises(PayloadError, match=r"^result\.r: .*NUL"):
        encode_result({"r": "x\x00y"}, max_bytes=100)
    with pytest.raises(PayloadError, match=r"^result\[0\]: nan"):
        encode_result([math.nan], max_bytes=100)
    with pytest.raises(PayloadError, match="max_payload_bytes=10"):
        encode_result("x" * 20, max_bytes=10)


def test_check_json_value_uses_the_given_path_name():
    with pytest.raises(PayloadError, match=r"^result\.a\[0\]: "):
        check_json_value({"a": [math.inf]}, "result")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"text"', "not a JSON object"),
        (b"\xff\xfe", "not valid JSON"),
        (42, "not a JSON object"),
        (["a"], "not a JSON object"),
        # Numbers that overflow a float: json.loads makes them infinity,
        # which enqueue refuses like NaN (a breaking run saw a task get inf).
        ('{"n": 1e400}', "args.n: inf"),
        ('{"n": -1E+999}', "args.n: -inf"),
        ('{"n": [' + "9" * 400 + ".5]}", "args.n[0]: inf"),
    ],
)
def test_decode_args_never_raises_and_explains(raw, reason):
    args, error = decode_args(raw)
    assert args is None
    assert error is not None
    assert reason in error


def test_decode_args_accepts_text_bytes_and_decoded_dicts():
    assert decode_args('{"a": 1}') == ({"a": 1}, None)
    assert decode_args('{"a": 1e308, "b": 1e-400, "c": 2.5E+100}') == (
        {"a": 1e308, "b": 0.0, "c": 2.5e100},
        None,
    )
    assert decode_args(b'{"a": 1}') == ({"a": 1}, None)
    assert decode_args({"a": 1}) == ({"a": 1}, None)


class _Text(str):
    """A str that is not exactly ``str``: decode_args takes its full path
    (json.loads, then the check of anything unusual) for it.
    """


json_text_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e308, 1e-320, 0.1, -0.0])
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)
# Number texts json.dumps never writes: overflowing exponents, 400 digits.
odd_numbers = st.sampled_from(
    ["1e400", "-1E+999", "9" * 400 + ".5", "1e-400", "2.5E+100", "1E3", "2" + "0" * 300 + "e8"]
)


@st.composite
def stored_args_texts(draw: st.DrawFn) -> str:
    """Text a json/TEXT column may hold: jobkeeper's own compact JSON, or
    JSON written by hand (NaN, escapes, spacing, odd numbers), or not JSON.
    """
    kind = draw(st.sampled_from(["dumped", "odd_number", "spaced", "garbage", "deep"]))
    if kind == "garbage":
        return draw(st.text(max_size=20))
    if kind == "deep":  # around MAX_DEPTH (64), brackets of both kinds
        depth = draw(st.integers(min_value=60, max_value=70))
        opener = draw(st.sampled_from(["[", '{"k":']))
        closer = "]" if opener == "[" else "}"
        return '{"n":' + opener * (depth - 1) + "1" + closer * (depth - 1) + "}"
    value = {"k": draw(json_text_values), "n": 1}
    text = json.dumps(
        value,
        allow_nan=True,
        ensure_ascii=draw(st.booleans()),
        separators=(",", ":") if kind != "spaced" else (", ", ": "),
    )
    if kind == "odd_number":
        text = text.replace('"n":1', '"n":' + draw(odd_numbers), 1)
    if kind == "spaced":
        text = draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", " "]))
    return text


@given(stored_args_texts())
@example('{"k":"\ud800","n":1}')  # a lone surrogate as itself: the fast path took it
@settings(max_examples=400)
def test_decode_args_fast_path_decides_as_the_full_path_does(text):
    # The claim decodes args with the C scanner alone, unless the text holds
    # something unusual; every text must get the answer the full path gives.
    fast_args, fast_error = decode_args(text)
    full_args, full_error = decode_args(_Text(text))
    assert (fast_error is None) == (full_error is None), (fast_error, full_error)
    if fast_error is None:
        assert same(fast_args, full_args)
    else:
        assert fast_error == full_error


# -- clean_text: any error text is storable ------------------------------------------------


def test_clean_text_escapes_nul_and_lone_surrogates_visibly():
    cleaned = clean_text("upstream said \x00 no \ud800!", max_chars=1000)
    assert cleaned == "upstream said \\x00 no \\ud800!"
    cleaned.encode("utf-8")  # storable


def test_clean_text_leaves_valid_text_alone():
    text = "héllo ✓ 😀 \u2028 line\nnext"
    assert clean_text(text, max_chars=1000) == text


def test_clean_text_bounds_size_and_keeps_head_and_tail():
    text = "HEAD" + "x" * 5_000_000 + "TAIL"
    cleaned = clean_text(text, max_chars=4000)
    assert len(cleaned) <= 4000 + 64
    assert cleaned.startswith("HEAD")
    assert cleaned.endswith("TAIL")
    assert "4996008 characters cut" in cleaned


@given(
    st.text(st.characters(exclude_categories=()), max_size=300),
    st.integers(min_value=1, max_value=400),
)
@example("\x00" * 50, 1)
@example("abcdef" * 20, 1)
@example("abcdef" * 20, 2)
def test_clean_text_output_is_always_storable_and_bounded(text, max_chars):
    cleaned = clean_text(text, max_chars=max_chars)
    assert "\x00" not in cleaned
    cleaned.encode("utf-8")  # no lone surrogates left
    assert len(cleaned) <= max_chars + 64
    storable = "\x00" not in text and not any("\ud800" <= c <= "\udfff" for c in text)
    if storable and len(text) <= max_chars:
        assert cleaned == text


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({"x": 10**5000}, "args.x"),
        ({"x": -(10**5000)}, "args.x"),
        ({"a": [1, {"b": 7**20000}]}, "args.a[1].b"),
    ],
)
def test_ints_beyond_pythons_digit_limit_are_a_payload_error(args, path):
    with pytest.raises(PayloadError, match=rf"^{re.escape(path)}: an int of \d+ bits is too large"):
        encode_args(args, max_bytes=256 * MiB)


def test_big_ints_within_the_digit_limit_round_trip():
    args = {"x": 10**4000, "y": -(2**10_000)}
    assert json.loads(encode_args(args, max_bytes=MiB)) == args
