"""Fixtures of the CLI tests: a migrated database to run the command on, and
a queue on it.
"""

from __future__ import annotations

import pytest

from jobkeeper import JobQueue
from support.cli import Cli


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli.migrated(db_url, capsys)


@pytest.fixture
def queue(cli: Cli):
    with JobQueue(cli.url) as jq:
        yield jq
