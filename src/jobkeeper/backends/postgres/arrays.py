"""The worker's batched writes' parameters as array literals (internal).

A start mark and a completion go out once per job, in batches of up to a
few hundred, as parallel arrays the statement unnests. psycopg dumps a
Python list element by element in Python, binary or text alike: the four
arrays of 100 completions cost about 150 us of client CPU a batch more than
the same arrays written here as ``{1,2,3}`` literals, whose work is
``str.join`` over ``map(str, ...)`` in C (py-spy on a drain: a quarter of
the completer's time went to dumping them). The statements cast each
literal (``%(ids)s::bigint[]``), so the server parses it as the array type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def int_array(values: Sequence[int]) -> str:
    """``{1,2,3}``: the literal of an array of ints."""
    return "{" + ",".join(map(str, values)) + "}"


def _quoted(value: str) -> str:
    # Inside double quotes an array element may hold anything but an
    # unescaped backslash or double quote (PostgreSQL's array input syntax).
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def text_array(values: Sequence[str | None]) -> str:
    """The literal of an array of texts (``None``: a NULL element), each
    element quoted; a run of one value (a batch's one worker id) is quoted
    once.
    """
    if not values:
        return "{}"
    first = values[0]
    if values.count(first) == len(values):
        element = "NULL" if first is None else _quoted(first)
        return "{" + ",".join([element] * len(values)) + "}"
    return "{" + ",".join(["NULL" if v is None else _quoted(v) for v in values]) + "}"


#: The arrays of texts among the batched writes' parameters; the rest hold ints.
_TEXT_ARRAYS = frozenset({"worker_ids", "results"})


def array_literals(arrays: dict[str, list[Any]]) -> dict[str, str]:
    """The parallel arrays of :func:`~jobkeeper.backends.rows.claim_arrays`
    or :func:`~jobkeeper.backends.rows.completion_arrays` as literals.
    """
    return {
        name: text_array(values) if name in _TEXT_ARRAYS else int_array(values)
        for name, values in arrays.items()
    }
