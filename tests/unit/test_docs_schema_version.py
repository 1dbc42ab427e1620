"""The docs quote the schema version this code migrates to; a migration that
leaves them behind sends a user's hand-made schema record (docs/deploying.md,
"A lost schema record") to a version whose columns already exist, and
``migrate`` then fails on them.
"""

from __future__ import annotations

import re
from pathlib import Path

from jobkeeper.backends.postgres.schema import MIGRATIONS as PG_MIGRATIONS
from jobkeeper.backends.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS

ROOT = Path(__file__).resolve().parents[2]
#: "0.1.0 (schema 18)" (a worker's recorded version), the lost-record SQL's
#: "VALUES (18" and its "With version 18".
QUOTES = re.compile(r"\(schema (\d+)\)|VALUES \((\d+)|With version (\d+)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_both_backends_migrate_to_one_version() -> None:
    assert int(PG_MIGRATIONS[-1][0]) == int(SQLITE_MIGRATIONS[-1][0])


def test_docs_quote_the_current_schema_version() -> None:
    current = int(PG_MIGRATIONS[-1][0])
    quoted: list[tuple[str, int]] = []
    for page in _pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in QUOTES.finditer(line):
                value = next(group for group in match.groups() if group is not None)
                quoted.append((f"{page.relative_to(ROOT)}:{number}", int(value)))
    assert len(quoted) >= 6, quoted  # the pages that quote it, found
    stale = [(where, value) for where, value in quoted if value != current]
    assert not stale, f"schema version {current} expected, the docs say: {stale}"
