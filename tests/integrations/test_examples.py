"""examples/plain_script.py runs as a user would run it, on both backends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_plain_script(db_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBKEEPER_")}
    env["EXAMPLE_DATABASE_URL"] = db_url
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "plain_script.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("resize: completed -> {'path': 'a.png', 'width': 100}")
    assert lines[1].endswith("flaky: completed -> flaky worked on attempt 2")
