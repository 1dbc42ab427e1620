"""Load named queries from a backend's ``queries.sql`` (once, at import).

A query starts at a ``-- name: job_claim`` line and runs to the next one; the
names equal the backend methods that run them, so a method and its SQL can be
found from each other with grep.
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """Parse ``package/filename`` into ``{name: sql}``.

    Raises:
        ValueError: a name appears twice.
    """
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    queries: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match.group(1)
        if name in queries:
            raise ValueError(f"{package}/{filename}: query {name!r} defined twice")
        queries[name] = text[match.end() : end].strip().rstrip(";")
    return queries


def load_migrations(package: str) -> list[tuple[int, str]]:
    """The ``NNNN_*.sql`` files of ``package``, as ``[(version, sql)]`` in order."""
    found = []
    for entry in resources.files(package).iterdir():
        match = re.match(r"(\d{4})_\w+\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text(encoding="utf-8")))
    return sorted(found)
