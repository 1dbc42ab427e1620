"""The ``jobkeeper`` command run in-process, as the CLI tests drive it."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest

from jobkeeper.cli.main import main


class Cli:
    """Runs ``jobkeeper --database URL ...`` in-process and captures the result.

    Calling it returns ``(exit code, stdout, stderr)``; ``database=False``
    leaves ``--database URL`` out, ``input`` is what the command reads on stdin.
    """

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    @classmethod
    def migrated(cls, url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
        """A runner on ``url`` after ``jobkeeper migrate`` succeeded there."""
        runner = cls(url, capsys)
        runner.ok("migrate")
        return runner

    def __call__(
        self, *args: str, database: bool = True, input: str | None = None
    ) -> tuple[int, str, str]:
        argv = ["--database", self.url, *args] if database else list(args)
        self.capsys.readouterr()
        with pytest.MonkeyPatch.context() as patch:
            if input is not None:
                patch.setattr(sys, "stdin", io.StringIO(input))
            with pytest.raises(SystemExit) as info:
                main(argv)
        out, err = self.capsys.readouterr()
        code = info.value.code
        return (code if isinstance(code, int) else 1), out, err

    def ok(self, *args: str, input: str | None = None) -> str:
        """stdout of a command that must exit 0 (else its stderr is the failure)."""
        code, out, err = self(*args, input=input)
        assert code == 0, err
        return out

    def json(self, *args: str) -> Any:
        """The parsed ``--json`` output of a command that must exit 0."""
        return json.loads(self.ok(*args, "--json"))
