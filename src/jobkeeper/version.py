"""The package version (leaf module: the backends record it for each worker),
and the version text a worker records: the release and the schema version
its code expects.
"""

from __future__ import annotations

import re

__version__ = "0.1.0"

#: The schema part of a recorded worker version, ``" (schema 17)"``.
_SCHEMA_PART = re.compile(r"\s*\(schema (\d+)\)\s*\Z")


def worker_version(schema: int) -> str:
    """What a worker of this code records as its version, e.g.
    ``"0.1.0 (schema 17)"``.

    Every build said ``0.1.0``, so the workers of a rolling deploy's old and
    new code looked alike in ``jobkeeper_workers``, ``status`` and the
    dashboard; the schema version the code expects tells them apart without
    a schema change (the column is free text).

    Args:
        schema: the schema version this code migrates to
            (``Backend.schema_expected()``).
    """
    return f"{__version__} (schema {schema})"


def split_worker_version(version: str | None) -> tuple[str | None, int | None]:
    """A recorded worker version as ``(release, schema version)``: the
    schema version is None for a worker of a build that recorded the
    release alone (``"0.1.0"``, every build before :func:`worker_version`),
    and both are None for one from before versions were recorded.
    """
    if not version:
        return None, None
    part = _SCHEMA_PART.search(version)
    if part is None:
        return version.strip(), None
    return version[: part.start()].strip(), int(part.group(1))
