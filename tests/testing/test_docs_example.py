"""The worked example of docs/testing.md, run as its reader would run it: the
application and test files taken from the page, pytest in a subprocess, on
SQLite and on PostgreSQL (--jobkeeper-database)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
PG_URL = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_worked_example(tmp_path: Path, backend: str) -> None:
    app, tests = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[:2]
    assert app.startswith("# myapp/jobs.py") and tests.startswith("# tests/test_jobs.py")
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(app)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_jobs.py").write_text(tests)
    (ini,) = re.findall(r"```ini\n(.*?)```", DOC.read_text(), re.S)
    (tmp_path / "pytest.ini").write_text(ini)
    extra = ["--jobkeeper-database", PG_URL] if backend == "postgres" else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER", "PYTEST"))}
    # The `pytest` command, as the page says: `python -m pytest` would put the
    # directory on sys.path and hide a page that forgot to (helper-67).
    pytest_command = str(Path(sys.executable).parent / "pytest")
    result = subprocess.run(
        [pytest_command, "-q", "-p", "no:cacheprovider", *extra],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
