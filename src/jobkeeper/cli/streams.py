"""stdout and stderr that never fail on a character their encoding lacks.

A command's output quotes what jobs hold (args, results, errors, queue and
task names), any Unicode text. On a stdout that cannot encode it
(``PYTHONIOENCODING=cp1252``, a Windows code page, a C locale without UTF-8)
the write raised ``UnicodeEncodeError``: ``enqueue --json`` had stored its
job when its output failed, so a script that retried made a duplicate.

Such a character is written as a JSON escape (``\\u65e5``; a pair of them
past the Basic Multilingual Plane) rather than ``backslashreplace``'s
``\\xe9`` or ``\\U0001f600``, which JSON does not know: outside its strings
JSON is ASCII, so a ``--json`` document or a ``--log-format json`` line stays
valid JSON with the same value, escaped only where it must be, and a UTF-8
terminal still shows the text as it is. In a table or a message the escape
reads as one.
"""

from __future__ import annotations

import codecs
import contextlib
import sys

#: The codec error handler installed on the CLI's stdout and stderr.
ESCAPE_ERRORS = "jobkeeper.jsonescape"


def _json_escape(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    # UTF-16 code units are what a JSON \u escape holds; surrogatepass takes
    # a lone surrogate (from a surrogateescape'd argv) as itself.
    units = error.object[error.start : error.end].encode("utf-16-be", "surrogatepass")
    escaped = "".join(
        f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)
    )
    return escaped, error.end


codecs.register_error(ESCAPE_ERRORS, _json_escape)


def escape_unencodable() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` write what their encoding
    cannot take as JSON escapes (:data:`ESCAPE_ERRORS`) instead of raising.

    A stream with a forgiving handler already (``replace``, ...) is left as
    it is, and so is a UTF-8 one with ``surrogateescape``, which writes an
    undecodable argv back as its bytes; one that cannot be reconfigured (not
    a ``TextIOWrapper``) too. stderr's own ``backslashreplace`` is replaced
    where the encoding is not UTF-8: its ``\xe9`` is no JSON escape.
    """
    for stream in (sys.stdout, sys.stderr):
        errors = getattr(stream, "errors", None)
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            unicode = codecs.lookup(encoding).name.startswith("utf")
        except LookupError:
            unicode = False
        # stderr opens with backslashreplace, whose \xe9 is no JSON escape:
        # a --log-format json line with one was no JSON.
        forgiving_but_not_json = errors in ("surrogateescape", "backslashreplace")
        if errors == "strict" or (forgiving_but_not_json and not unicode):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.reconfigure(errors=ESCAPE_ERRORS)  # type: ignore[union-attr]


def as_stdout_takes(text: str) -> str:
    """``text`` with what stdout's encoding cannot take already escaped as
    the stream would write it: for a table cell, whose width Rich measures
    before the write (``日本`` is 4 columns, ``\\u65e5\\u672c`` 12).
    """
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        return text.encode(encoding, ESCAPE_ERRORS).decode(encoding)
    except (LookupError, UnicodeError):
        return text
