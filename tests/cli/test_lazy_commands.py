"""The root group loads a command's module only when that command runs, so
that `jobkeeper worker` starts without the modules only other commands use."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from jobkeeper.cli.main import COMMANDS, app


def test_the_command_list_shows_every_command_in_order(capsys):
    ctx = click.Context(app)
    assert app.list_commands(ctx) == list(COMMANDS)
    for name in COMMANDS:
        command = app.get_command(ctx, name)
        assert command is not None and command.name == name
    assert app.get_command(ctx, "no-such-command") is None


def test_the_worker_command_imports_neither_rich_nor_verify():
    probe = (
        "import sys, click\n"
        "from jobkeeper.cli.main import app\n"
        "app.get_command(click.Context(app), 'worker')\n"
        "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('jobkeeper.verify')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_an_unknown_command_is_a_usage_error(capsys):
    from jobkeeper.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["no-such-command"])
    assert exit_.value.code == 2
    assert "No such command 'no-such-command'" in capsys.readouterr().err


@pytest.mark.skipif(
    not hasattr(click.exceptions, "NoSuchCommand"), reason="Click < 8.4 suggests no names"
)
def test_a_misspelled_command_gets_a_suggestion(capsys):
    from jobkeeper.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["statsu"])
    assert exit_.value.code == 2
    assert "Did you mean 'status'?" in capsys.readouterr().err
