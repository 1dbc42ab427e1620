"""An invalid database URL taken from $JOBKEEPER_DATABASE_URL says so: the
command line and the code that failed named none.

Found by a break-test: ``JOBKEEPER_DATABASE_URL=bogus jobkeeper status``
said "invalid database URL 'bogus'", with nothing pointing at the variable.
"""

from __future__ import annotations

import pytest

from cli.helpers import assert_one_line_error
from jobkeeper import ConfigError, JobQueue
from support.cli import Cli

FROM_ENV = "(from $JOBKEEPER_DATABASE_URL)"
BAD = [
    ("bogus", "invalid database URL 'bogus'"),
    ("mysql://x/y", "mysql:// is not supported"),
    ("postgresql://127.0.0.1:99999/db", "invalid PostgreSQL URL"),
    ("sqlite://relative.db", "sqlite"),
]


@pytest.mark.parametrize(("url", "needle"), BAD)
def test_the_cli_names_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str, needle: str
) -> None:
    monkeypatch.setenv("JOBKEEPER_DATABASE_URL", url)
    cli = Cli(url, capsys)
    for command in (["status"], ["migrate"], ["enqueue", "t"], ["verify", "--minutes", "0.1"]):
        code, out, err = cli(*command, database=False)
        assert code == 2, (command, err)
        assert_one_line_error(err, needle, FROM_ENV)
        assert out == ""
    # Given with --database, the URL is the command line's own.
    code, _, err = cli("status")
    assert code == 2 and needle in err and FROM_ENV not in err


@pytest.mark.parametrize(("url", "needle"), BAD)
def test_jobqueue_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, url: str, needle: str
) -> None:
    monkeypatch.setenv("JOBKEEPER_DATABASE_URL", url)
    with pytest.raises(ConfigError) as refused:
        JobQueue()
    assert needle in str(refused.value) and str(refused.value).endswith(FROM_ENV)
    with pytest.raises(ConfigError) as given:
        JobQueue(url)
    assert FROM_ENV not in str(given.value)
