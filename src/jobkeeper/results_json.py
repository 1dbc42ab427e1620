"""Encoding a task's result (internal): what :mod:`jobkeeper.payload` checks
for args, except that tuples, at any depth, become JSON arrays.
"""

from __future__ import annotations

from typing import Any

from jobkeeper.errors import PayloadError
from jobkeeper.payload import MAX_DEPTH, child_path, encode_checked


def encode_result(result: Any, *, max_bytes: int) -> str | None:
    """Validate a task's return value and return its JSON text (``None`` for ``None``).

    A result is what args are (see :func:`check_json_value`), except that
    tuples, at any depth (namedtuples too), are stored as JSON arrays, as
    Celery's and Dramatiq's JSON serializers store them: ``return a, b`` is
    the common Python return, and a waiter gets a list back. Args keep
    refusing tuples: what a task receives is exactly what was enqueued.

    Args:
        result: the value a task returned (or gave ``complete_in``).
        max_bytes: largest accepted size of the UTF-8 encoded JSON, in bytes.

    Returns:
        The JSON text to store, or None for None.

    Raises:
        PayloadError: the value is not JSON-native (a set, NaN, bytes, an
            object...; named by its path) or is larger than ``max_bytes``.
    """
    if result is None:
        return None
    if isinstance(result, tuple):
        # `return a, b`: a list for the fast paths, which then take it (a
        # tuple inside is left to the walk below).
        result = list(result)
    try:
        return encode_checked(result, "result", max_bytes)
    except PayloadError:
        # Only a refused result pays for the walk: a tuple inside it is
        # listed and the whole checked again (a set beside it is still
        # refused, by its path); with none, the refusal stands.
        listed = _tuples_listed(result)
        if listed is result:
            raise
        return encode_checked(listed, "result", max_bytes)


#: Marks a container of :func:`_tuples_listed` while it is walked.
_WALKING = object()


def _tuples_listed(
    value: Any, path: str = "result", depth: int = 0, seen: dict[int, Any] | None = None
) -> Any:
    """``value`` with every tuple in it made a list; ``value`` itself (the
    same object) when it holds none. Each container is walked once (``seen``,
    by id), so shared ones cost nothing more.

    Raises:
        PayloadError: nested deeper than ``MAX_DEPTH`` or holding itself,
            named by its path as :func:`check_json_value` names it.
    """
    if not isinstance(value, tuple | list | dict):
        return value
    if seen is None:
        seen = {}
    key = id(value)
    done = seen.get(key)
    if done is not None and done is not _WALKING:
        return done
    if done is _WALKING or depth >= MAX_DEPTH:
        raise PayloadError(f"{path}: nested deeper than {MAX_DEPTH} levels (or refers to itself)")
    seen[key] = _WALKING
    if isinstance(value, dict):
        listed = [
            _tuples_listed(child, child_path(path, name), depth + 1, seen)
            if isinstance(name, str)
            else child  # a key check_json_value refuses, by its path
            for name, child in value.items()
        ]
        children: Any = value.values()
    else:
        listed = [
            _tuples_listed(child, child_path(path, index), depth + 1, seen)
            for index, child in enumerate(value)
        ]
        children = value
    if isinstance(value, tuple):
        result: Any = listed
    elif all(new is old for new, old in zip(listed, children, strict=True)):
        result = value
    elif isinstance(value, dict):
        result = dict(zip(value, listed, strict=True))
    else:
        result = listed
    seen[key] = result
    return result
