"""Python entry points without their extra, driver or server say what is
wrong in one line, as the CLI and ``JobQueue(...)`` do.

Found by a break-test: ``import jobkeeper.dashboard`` without the
``dashboard`` extra raised "No module named 'jinja2'"; the pytest plugin
pointed at PostgreSQL raised psycopg's ``ModuleNotFoundError`` (no driver)
or ``OperationalError`` (no server), with a traceback, in every test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.mark.parametrize("missing", ["jinja2", "starlette"])
def test_the_dashboard_without_its_extra_names_it(missing: str) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules[{missing!r}] = None  # as if not installed
        try:
            from jobkeeper.dashboard import create_app
        except ImportError as exc:  # still an ImportError, with the module's name
            print(type(exc).__name__, exc.name, exc, sep="|")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kind, name, message = done.stdout.strip().split("|")
    assert kind == "ModuleNotFoundError" and name.partition(".")[0] == missing
    assert message == (
        f"jobkeeper.dashboard needs the dashboard extra ({missing} is not installed): "
        "pip install 'jobkeeper[dashboard]'"
    )


def run_pytest(project: Path, *args: str, env: dict[str, str] | None = None) -> str:
    (project / "test_uses_it.py").write_text(
        "def test_one(jobkeeper_queue):\n    pass\n\n"
        "def test_two(jobkeeper_database_url):\n    pass\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER", "PYTEST"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 errors" in done.stdout, done.stdout
    return done.stdout


def assert_only_the_message(output: str, message: str) -> None:
    """Each test's error is ``message`` on one line: no traceback, no chain."""
    for test in ("test_one", "test_two"):
        section = output.split(f"ERROR at setup of {test} ")[1].split("\n", 1)[1]
        assert section.split("\n", 1)[0] == message, output
    assert "Traceback" not in output and "During handling" not in output, output
    assert "psycopg.OperationalError" not in output and "ModuleNotFoundError" not in output


def test_the_plugin_on_an_unreachable_server_says_so_in_one_line(tmp_path: Path) -> None:
    server = "postgresql://postgres@127.0.0.1:1/test"
    output = run_pytest(tmp_path, "--jobkeeper-database", server)
    assert_only_the_message(
        output,
        f"--jobkeeper-database: PostgreSQL at {server} is unavailable: connection failed: "
        'connection to server at "127.0.0.1", port 1 failed: Connection refused',
    )


def test_the_plugin_without_psycopg_names_the_extra(tmp_path: Path) -> None:
    # The project's conftest hides psycopg before any fixture runs.
    (tmp_path / "conftest.py").write_text("import sys\nsys.modules['psycopg'] = None\n")
    output = run_pytest(
        tmp_path, env={"JOBKEEPER_TEST_DATABASE_URL": "postgresql://postgres@127.0.0.1/test"}
    )
    assert_only_the_message(
        output,
        "$JOBKEEPER_TEST_DATABASE_URL: PostgreSQL needs psycopg 3, which is not installed: "
        "pip install 'jobkeeper[postgres]'",
    )
