"""``--args``: the JSON object of a job's arguments, parsed strictly."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from jobkeeper.cli.common import (
    BadInput,
)
from jobkeeper.payload import child_path


class _NonJsonConstant:
    """Stands in for a ``NaN``/``Infinity``/``-Infinity`` literal while
    ``--args`` is parsed, so that the error can name where it is
    (``args.a[1].b``), as the API's own check does (sidekiq#3294).
    """

    def __init__(self, name: str) -> None:
        self.name = name


class _FloatOverflow:
    """Stands in for a JSON number too large for a float (``1e999``), which
    Python's parser would read as Infinity, a value the API refuses.
    """

    def __init__(self, literal: str) -> None:
        self.literal = literal


class _TooLongInt:
    """Stands in for a JSON integer past Python's int/str digit limit
    (``sys.get_int_max_str_digits()``) while ``--args`` is parsed, so that the
    error can name where it is instead of repeating Python's advice.
    """

    def __init__(self, digits: int, limit: int) -> None:
        self.digits = digits
        self.limit = limit


#: What stands in for a value ``--args`` cannot hold, while it is parsed.
_Marker = _TooLongInt | _NonJsonConstant | _FloatOverflow


def _shortened(literal: str, keep: int = 16) -> str:
    """``literal`` whole, or its first and last ``keep`` characters around an
    ellipsis (a number's exponent is at its end).
    """
    if len(literal) <= 2 * keep + 3:
        return literal
    return f"{literal[:keep]}...{literal[-keep:]} ({len(literal)} characters)"


def _find_marker(value: Any) -> tuple[str, _Marker]:
    """The path (``args.a[1].b``) and marker of the first value ``--args``
    cannot hold (a too-long integer, a NaN/Infinity literal, a number past
    a float's range).
    """
    # Iterative, in document order: the JSON may be nested deeply.
    stack: list[tuple[Any, str]] = [(value, "args")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Marker):
            return path, item
        children: list[tuple[Any, str]] = []
        if isinstance(item, dict):
            children = [(child, child_path(path, key)) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, child_path(path, i)) for i, child in enumerate(item)]
        stack.extend(reversed(children))
    raise AssertionError("a marker was parsed but not found")  # pragma: no cover


def parse_args_json(text: str) -> dict[str, Any]:
    """Parse ``--args``: a JSON object, strictly (no NaN/Infinity, no duplicate keys).

    Raises:
        BadInput: naming the problem.
    """

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise BadInput(f"--args: duplicate key {key!r}")
            seen[key] = value
        return seen

    markers: list[_Marker] = []

    def parse_constant(name: str) -> _NonJsonConstant:
        marker = _NonJsonConstant(name)
        markers.append(marker)
        return marker

    def parse_int(digits: str) -> int | _TooLongInt:
        limit = sys.get_int_max_str_digits()
        length = len(digits.lstrip("-"))
        if limit and length > limit:
            marker = _TooLongInt(length, limit)
            markers.append(marker)
            return marker
        return int(digits)

    def parse_float(literal: str) -> float | _FloatOverflow:
        number = float(literal)
        if math.isinf(number):
            marker = _FloatOverflow(literal)
            markers.append(marker)
            return marker
        return number

    try:
        value = json.loads(
            text,
            parse_constant=parse_constant,
            parse_int=parse_int,
            parse_float=parse_float,
            object_pairs_hook=no_duplicates,
        )
    except json.JSONDecodeError as exc:
        raise BadInput(f"--args is not valid JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit limit
        raise BadInput(f"--args cannot be read: {exc}") from None
    except RecursionError:
        raise BadInput("--args: JSON nested too deeply") from None
    if markers:
        path, marker = _find_marker(value)
        if isinstance(marker, _NonJsonConstant):
            raise BadInput(
                f"--args: {path} is {marker.name}, which is not valid JSON "
                "(NaN and Infinity are refused)"
            )
        if isinstance(marker, _FloatOverflow):
            raise BadInput(
                f"--args: {path} is {_shortened(marker.literal)}, too large for a 64-bit float "
                "(it would be Infinity, which is refused)"
            )
        raise BadInput(
            f"--args: {path} is an integer of {marker.digits} digits; integers with more "
            f"than {marker.limit} digits are not supported"
        )
    if not isinstance(value, dict):
        raise BadInput(f"--args must be a JSON object, got {json_type(value)}: {text[:60]}")
    return value


def json_type(value: Any) -> str:
    """The JSON name of a parsed JSON value's type ("array", "null"...): the
    user wrote JSON, and Python's "NoneType" or "list" was no word of theirs.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: a bool is one
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


#: How many times the job's payload limit ``--args`` text may be: room for
#: indentation and escapes that the encoded args do not keep.
TEXT_PER_PAYLOAD_BYTE = 4


def read_args_text(value: str, *, max_payload_bytes: int) -> str:
    """The text of ``--args``: ``-`` reads stdin, ``@path`` reads that file
    (UTF-8), anything else is the JSON itself.

    Args:
        value: the option as given.
        max_payload_bytes: the queue's limit on encoded args, bytes; a file or
            stdin is read up to ``TEXT_PER_PAYLOAD_BYTE`` times that, never
            whole (``--args @/dev/zero`` must not fill the memory).

    Raises:
        BadInput: the file cannot be read, or is longer than that, naming it.
    """
    cap = TEXT_PER_PAYLOAD_BYTE * max_payload_bytes
    if value == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        data = stdin.read(cap + 1) if stdin is not None else sys.stdin.read(cap + 1)
        return _within(value, "stdin", data, cap, max_payload_bytes)
    if value.startswith("@"):
        path = value[1:]
        if not path:
            raise BadInput("--args @: give a file name after @ (or - for stdin)")
        if "\x00" in path:
            # open() raised ValueError ("embedded null byte"), a traceback.
            raise BadInput(f"--args {value!r}: a file name cannot hold a NUL character")
        try:
            with open(path, "rb") as file:
                return _within(value, repr(path), file.read(cap + 1), cap, max_payload_bytes)
        except OSError as exc:
            detail = exc.strerror or str(exc)
            raise BadInput(f"--args {value}: cannot read {path!r}: {detail}") from None
        except UnicodeEncodeError:  # a lone surrogate: no file system name
            raise BadInput(f"--args {value!r}: {path!r} cannot be a file name here") from None
    return value


def _within(value: str, source: str, data: bytes | str, cap: int, max_payload_bytes: int) -> str:
    """``data`` as text, refused when it is longer than ``cap`` or not UTF-8."""
    if len(data) > cap:
        raise BadInput(
            f"--args {value}: {source} holds more than {cap} bytes; a job's args encode to at"
            f" most max_payload_bytes={max_payload_bytes} bytes"
        )
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"--args {value}: cannot read {source}: {exc}") from None
