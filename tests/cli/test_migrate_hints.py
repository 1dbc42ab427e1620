"""Every "run `jobkeeper ... migrate`" hint names the database it is about,
so that running it as written migrates that one, not ./jobkeeper.db.

Found by a break-test: for an empty (0-byte) SQLite file, ``status``,
``doctor``, ``worker`` and ``enqueue`` said "run `jobkeeper migrate`".
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jobkeeper.doctor import _claim_plan

HINT = re.compile(r"run `(jobkeeper --database [^`]+ migrate)`")


def jobkeeper(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "command",
    [["status"], ["doctor"], ["worker", "--app", "app:jq", "--burst"], ["enqueue", "add"]],
)
def test_the_hint_for_an_empty_sqlite_file_migrates_that_file(
    tmp_path: Path, command: list[str]
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "empty.db").touch()
    (project / "app.py").write_text("from jobkeeper import JobQueue\njq = JobQueue()\n")
    refused = jobkeeper(project, "--database", "sqlite:///empty.db", *command)
    assert refused.returncode == 1
    said = refused.stdout + refused.stderr
    assert "is empty (0 bytes)" in said
    hint = HINT.search(said)
    assert hint is not None, said
    done = jobkeeper(elsewhere, *shlex.split(hint[1])[1:])
    assert done.returncode == 0, done.stderr
    assert (project / "empty.db").stat().st_size > 0
    assert not (elsewhere / "jobkeeper.db").exists()


def test_doctors_claim_plan_hint_names_the_database() -> None:
    hint = "run `jobkeeper --database sqlite:///x.db migrate` (or JobQueue.migrate())"
    check = _claim_plan({"claim_uses_index": False, "backend": "sqlite"}, hint)
    assert check.level == "fail" and hint in check.message
