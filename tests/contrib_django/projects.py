"""The example Django project, copied for a test (internal to these tests):
where it is, how to run its ``manage.py``, and on which databases.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_project"
PG_URL = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = [
    name.strip()
    for name in os.environ.get("JOBKEEPER_TEST_BACKENDS", "sqlite,postgres").split(",")
    if name.strip()
]


def copy_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the example project, and an environment free of ours."""
    directory = tmp_path / "django_project"
    shutil.copytree(EXAMPLE, directory, ignore=shutil.ignore_patterns("db.sqlite3", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER_", "DJANGO_"))}
    return directory, env


def sqlite_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """:func:`copy_project` on a SQLite file of its own."""
    directory, env = copy_project(tmp_path)
    env["EXAMPLE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'shop.db'}"
    return directory, env


def manage(project: tuple[Path, dict[str, str]], *args: str, timeout: float = 120) -> str:
    directory, env = project
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def shell(project: tuple[Path, dict[str, str]], code: str) -> dict:
    # The backport names its module django_tasks; Django >= 6 has django.tasks.
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        code = code.replace("from django.tasks import", "from django_tasks import")
    out = manage(project, "shell", "-c", code)
    return json.loads(out.strip().splitlines()[-1])


def manage_test(directory: Path, env: dict[str, str], *args: str) -> str:
    """``manage.py test`` with ``args``, which must pass; its report (stderr)."""
    result = subprocess.run(
        [sys.executable, "manage.py", "test", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result.stderr
