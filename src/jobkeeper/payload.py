"""Validation and canonical JSON encoding of job args, results and error text.

Every payload is checked before anything is written, with an error that names
the path of the offending value (``args.a[1].b``). The rules are the ones both
backends can store byte for byte: PostgreSQL ``jsonb`` refuses U+0000 (awa#85),
strict JSON parsers refuse NaN/Infinity (sidekiq#3294), and UTF-8 cannot carry
lone surrogates.
"""

from __future__ import annotations

import json
import json.scanner
import math
import re
from collections.abc import Callable
from typing import Any

from jobkeeper.errors import PayloadError

_orjson_dumps: Callable[[Any], bytes] | None
try:  # the `fast` extra
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - tests force it off instead
    _orjson_dumps = None

#: Deepest nesting of lists/objects accepted (also stops self-referencing data).
MAX_DEPTH = 64

#: Ints longer than this many bits are checked against Python's int-to-text
#: digit limit (4300 digits is about 14,284 bits).
_INT_BITS_CHECKED = 14_000

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# NUL, or a UTF-16 surrogate that is not part of a valid pair (Python strs
# hold lone surrogates as code points U+D800-U+DFFF).
_UNSTORABLE_CHAR = re.compile("[\x00\ud800-\udfff]")


def child_path(path: str, key: str | int) -> str:
    """How errors name ``path``'s member ``key``: ``args.a``, ``args[0]``,
    ``args['odd key']``.
    """
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{_short_repr(key)}]"


def _short_repr(value: object, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int past Python's 4300-digit limit
        text = f"<a {type(value).__name__} that cannot be shown>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_str(text: str, path: str, what: str, stored_as: str = "JSON text") -> None:
    bad = _UNSTORABLE_CHAR.search(text)
    if bad is None:
        return
    char = bad.group()
    kind = "a NUL character (\\x00)" if char == "\x00" else f"a lone surrogate (\\u{ord(char):04x})"
    raise PayloadError(
        f"{path}: {what} {_short_repr(text)} contains {kind} at index {bad.start()}; "
        f"it cannot be stored as {stored_as}"
    )


def check_text(text: str, name: str) -> str:
    """Check that an option's text (``serial_key``...) is storable as it is.

    Raises:
        PayloadError: naming ``name`` and where its NUL or lone surrogate is,
            as for a string in args.
    """
    # Options are text columns of their own, not JSON (a NUL is refused there too).
    _check_str(text, name, "string", stored_as="text in the database")
    return text


def check_json_value(value: Any, path: str) -> None:
    """Check that ``value`` is made only of JSON-native values.

    Accepted: ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite
    ``float``, ``bool``, ``None``. Tuples, sets, bytes, datetimes and other
    objects are refused rather than silently converted, so what the task
    receives is exactly what was enqueued. (A result's tuples are made
    lists before this check: see :func:`jobkeeper.results_json.encode_result`.)

    Args:
        value: the value to check.
        path: how to name the value in errors, e.g. ``"args"``.

    Raises:
        PayloadError: naming the path and value of the first offence.
    """
    # Iterative walk: deep or self-referencing data cannot hit Python's
    # recursion limit inside the validator itself.
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, item_path, depth = stack.pop()
        if item is None or isinstance(item, bool | int):
            # Python refuses to turn ints of more than 4300 digits into text
            # (sys.get_int_max_str_digits); refuse them here, named.
            if item is not None and item.bit_length() > _INT_BITS_CHECKED:
                try:
                    str(item)
                except ValueError:
                    raise PayloadError(
                        f"{item_path}: an int of {item.bit_length()} bits is too large "
                        "to encode as JSON"
                    ) from None
            continue
        if isinstance(item, str):
            _check_str(item, item_path, "string")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise PayloadError(
                    f"{item_path}: {item!r} is not a JSON number (NaN and Infinity are refused)"
                )
            continue
        if depth >= MAX_DEPTH:
            raise PayloadError(
                f"{item_path}: nested deeper than {MAX_DEPTH} levels (or refers to itself)"
            )
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise PayloadError(
                        f"{item_path}: object key {_short_repr(key)} is "
                        f"{_with_article(type(key).__name__)}; JSON object keys must be strings"
                    )
                _check_str(key, item_path, "object key")
                stack.append((child, child_path(item_path, key), depth + 1))
            continue
        if isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, child_path(item_path, index), depth + 1))
            continue
        raise PayloadError(
            f"{item_path}: {_short_repr(item)} is {_with_article(type(item).__name__)}, "
            "not a JSON value "
            "(use dict, list, str, int, float, bool or None)"
        )


def _with_article(kind: str) -> str:
    """``kind`` after "a" or "an" ("an int", "a tuple")."""
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> str:
    """Canonical compact JSON text (UTF-8, not ASCII-escaped, NaN refused)."""
    return _ENCODER.encode(value)


def _c_encoder() -> Any:
    """The C encoder behind ``_ENCODER``, made once, or None where there is none.

    ``JSONEncoder.encode`` makes a new one on every call (and a dict for its
    circular-reference check): 0.4 us of the 0.6 us that encoding ``{}``
    took. This one has no such check: data that refers to itself raises
    RecursionError, which sends :func:`_encode_checked` down its slow walk,
    which names it. Its output is checked against ``dumps`` here, so an
    interpreter whose private constructor differs falls back to ``dumps``.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    sample = {"a": [1, 2.5, None, True, "\u00e9\n"], "b": {}}
    try:
        encoder = make(
            None, _ENCODER.default, json.encoder.encode_basestring,
            None, ":", ",", False, False, False,
        )  # fmt: skip
        same = "".join(encoder(sample, 0)) == dumps(sample)
    except Exception:  # noqa: BLE001 - another shape of the private constructor
        return None
    try:
        encoder({"nan": math.nan}, 0)
    except ValueError:
        return encoder if same else None  # NaN refused, as by _ENCODER
    return None


_C_ENCODER = _c_encoder()


def _dumps_fast(value: Any) -> str:
    """:func:`dumps` without the circular-reference check (see :func:`_c_encoder`)."""
    if _C_ENCODER is None:
        return dumps(value)
    return "".join(_C_ENCODER(value, 0))


def encode_args(args: Any, *, max_bytes: int) -> str:
    """Validate job args and return their canonical JSON text.

    Args:
        args: must be a ``dict`` of JSON-native values (see :func:`check_json_value`).
        max_bytes: largest accepted size of the UTF-8 encoded JSON, in bytes.

    Returns:
        The JSON text to store.

    Raises:
        PayloadError: ``args`` is not a dict, holds a non-JSON value, or its
            encoding is larger than ``max_bytes``.
    """
    if not isinstance(args, dict):
        raise PayloadError(
            f"args: must be a JSON object (a dict of keyword arguments), got "
            f"{type(args).__name__} {_short_repr(args)}"
        )
    return encode_checked(args, "args", max_bytes)


_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
#: Values whose orjson text is ``dumps``' byte for byte (tests/unit/
#: test_payload.py compares them over every code point). Floats are left
#: out: orjson writes ``1e16`` where ``repr`` writes ``1e+16``, and NaN as
#: ``null`` where ``dumps`` refuses it.
_ORJSON_SCALARS = frozenset({str, int, bool, type(None)})


def _is_flat_object(value: Any) -> bool:
    """A dict of exactly-typed scalars under str keys: json.dumps is exact for it."""
    # issuperset(map(type, ...)): the whole walk in C.
    return (
        type(value) is dict
        and _STR.issuperset(map(type, value))
        and _SCALARS.issuperset(map(type, value.values()))
    )


def encode_checked(value: Any, path: str, max_bytes: int) -> str:
    """Encode ``value``, refusing what :func:`check_json_value` refuses.

    Args:
        value: any value (:func:`encode_args` first requires a dict).
        path: how errors name it (``"args"``).
        max_bytes: largest accepted size of the UTF-8 encoded JSON, in bytes.

    Returns:
        The canonical JSON text.

    Raises:
        PayloadError: a non-JSON value (named by its path), or too large.

    Fast paths, all in C: a dict of strings, ints, bools and None is
    encoded by orjson when the ``fast`` extra is installed; anything else is
    encoded, then decoded and compared. ``json.dumps``
    quietly turns tuples into lists and int keys into strings, and the round
    trip's equality catches exactly those; NaN/Infinity raise; NUL shows up
    as ``\\u0000`` and lone surrogates fail the UTF-8 encoding. Anything odd
    (or nesting that could exceed ``MAX_DEPTH``) takes the slow walk, which
    also produces the error message naming the path.
    """
    if type(value) is dict and not value:
        text, size, fast_ok = "{}", 2, True  # a task without arguments
    elif (
        _orjson_dumps is not None
        and type(value) is dict
        and _ORJSON_SCALARS.issuperset(map(type, value.values()))
    ):
        # The usual args (names, ids, flags) in a tenth of the json module's
        # time. orjson refuses keys that are not exactly str, lone surrogates
        # and ints past 64 bits (TypeError): the checked path then takes
        # them, and accepts or names them as it always has.
        try:
            encoded = _orjson_dumps(value)
            text, size = encoded.decode(), len(encoded)
            fast_ok = "\\u0000" not in text
        except TypeError:
            fast_ok = False
    else:
        try:
            text = _dumps_fast(value)
            # Only ASCII has one byte per character; anything else is
            # encoded, which also refuses lone surrogates.
            size = len(text) if text.isascii() else len(text.encode("utf-8"))
            fast_ok = "\\u0000" not in text and (
                _is_flat_object(value)  # one level deep: no need to count brackets
                or (text.count("[") + text.count("{") <= MAX_DEPTH and json.loads(text) == value)
            )
        except (ValueError, TypeError, RecursionError):
            fast_ok = False
    if not fast_ok:
        check_json_value(value, path)
        text = dumps(value)
        size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(
            f"{path}: encoded size {size} bytes exceeds max_payload_bytes={max_bytes} bytes"
        )
    return text


class _UnusualTextError(Exception):
    """Raised by the fast decoder's hooks: the text needs the full check."""


def _refuse_constant(name: str) -> Any:
    raise _UnusualTextError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 overflows to inf
        raise _UnusualTextError(text)
    return value


def _fast_scanner() -> Any:
    """``json``'s C scanner, decoding as ``json.loads`` does, except that
    NaN/Infinity and floats that overflow raise :class:`_UnusualTextError`; None
    where the interpreter has no C scanner.
    """
    make = getattr(json.scanner, "c_make_scanner", None)
    if make is None:
        return None
    return make(json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float))


_SCAN = _fast_scanner()


def _decode_plain(text: str) -> Any:
    """The value of ``text`` when it is plainly JSON that enqueue would have
    written -- no NaN/Infinity, no float that overflows, no NUL or surrogate
    escape, nothing around the value, no more brackets than ``MAX_DEPTH``
    (so no deeper nesting) -- else :class:`_UnusualTextError`.

    ``json.loads`` took 2.2 us for a 40-byte object and the regex that looked
    for the unusual 1.4 us, where the C scanner alone takes 0.3 us: a claim
    decodes every job's args. Numbers and constants are judged by the
    scanner's hooks as it meets them; the text is only searched for ``\\u``
    (non-ASCII is stored as itself: an escape is rare) and its brackets
    counted, both in C.
    """
    if _SCAN is None or "\\u" in text or text.count("{") + text.count("[") > MAX_DEPTH:
        raise _UnusualTextError(text)
    if not text.isascii() and _UNSTORABLE_CHAR.search(text):
        # A lone surrogate as itself, not escaped: the scanner takes it
        # (hypothesis found '{"k":"\ud800"}'). isascii() is a flag read, so
        # only non-ASCII text pays for the search.
        raise _UnusualTextError(text)
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, ValueError, RecursionError):
        raise _UnusualTextError(text) from None
    if end != len(text):
        raise _UnusualTextError(text)
    return value


def decode_args(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Decode stored args; never raises.

    Returns:
        ``(args, None)`` when ``raw`` is (or parses to) a JSON object, else
        ``(None, reason)`` so the worker can fail the attempt with the reason.
    """
    if type(raw) is str:
        try:
            plain = _decode_plain(raw)
        except _UnusualTextError:
            pass
        else:
            if type(plain) is dict:
                return plain, None
    value = raw
    if isinstance(raw, str | bytes):
        try:
            value = json.loads(raw)
        except ValueError as exc:
            return None, f"stored args are not valid JSON ({exc}): {_short_repr(raw)}"
        except RecursionError:
            # Valid JSON to the database (SQLite, jsonb), but nested past
            # what Python's parser can follow.
            return None, (
                f"stored args are nested too deeply for Python's JSON parser: {_short_repr(raw)}"
            )
    if not isinstance(value, dict):
        return None, f"stored args are not a JSON object: {_short_repr(value)}"
    try:
        # What comes here -- text with something unusual in it, args a driver
        # decoded -- is checked as enqueue checks: json.loads accepts NaN,
        # Infinity, NUL escapes and numbers that overflow to inf, and a row
        # written outside jobkeeper must not hand the task what enqueue
        # would refuse.
        check_json_value(value, "args")
    except PayloadError as exc:
        return None, f"stored args are not valid job args: {exc}"
    return value, None


def clean_text(text: str, *, max_chars: int) -> str:
    """Make arbitrary text (an exception message, a traceback) storable.

    NUL becomes the visible escape ``\\x00``, lone surrogates become ``\\udXXX``
    escapes, and text longer than ``max_chars`` keeps its head and tail around
    a marker saying how much was cut (windmill#10274, pg-boss: a failure that
    cannot be written leaves the job stuck).
    """
    if _UNSTORABLE_CHAR.search(text):
        text = text.replace("\x00", "\\x00")
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > max_chars:
        keep = max_chars // 2
        cut = len(text) - 2 * keep
        # text[len - keep:], not text[-keep:]: keep is 0 when max_chars is 1.
        text = f"{text[:keep]}\n... [{cut} characters cut] ...\n{text[len(text) - keep :]}"
    return text
