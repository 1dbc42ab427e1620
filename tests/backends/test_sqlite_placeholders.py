"""SQLite statements bind their parameters as every Python >= 3.11 reads
them: ``?`` with a sequence or ``:name`` with a dict, never numbered
``?NNN``. Python 3.12.0-3.12.3 misread numbered placeholders bound to a
sequence as named (CPython gh-117995): ``enqueue_many`` warned
"DeprecationWarning: Binding 1 ('?1') is a named parameter" on every call,
and raised under ``-W error::DeprecationWarning``.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import pytest

import jobkeeper
from jobkeeper.backends.sqlite.queries import QUERIES
from support.pythons import python_with_jobkeeper

NUMBERED = re.compile(r"\?\d")
SQLITE_SOURCES = Path(jobkeeper.__file__).parent / "backends" / "sqlite"


def without_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def test_no_sqlite_statement_uses_numbered_placeholders():
    numbered = [name for name, sql in QUERIES.items() if NUMBERED.search(without_comments(sql))]
    assert numbered == []
    # Nor SQL written in the backend's Python.
    for path in sorted(SQLITE_SOURCES.glob("*.py")):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        strings = [t for t in tokens if t.type == tokenize.STRING and NUMBERED.search(t.string)]
        assert strings == [], path


SCRIPT = textwrap.dedent(
    """
    import sys

    from jobkeeper import JobQueue
    from jobkeeper.testing import drain

    with JobQueue(sys.argv[1]) as jq:

        @jq.task
        def add(a: int, b: int) -> int:
            return a + b

        jq.migrate()
        jq.enqueue_many([("add", {"a": i, "b": 1}) for i in range(50)])
        jq.enqueue_many([("add", {"a": i, "b": 2}, {"serial_key": "s"}) for i in range(5)])
        jq.enqueue_many([("add", {"a": 1, "b": 1}, {"unique_key": "k"})] * 2)
        add.enqueue(a=1, b=2)
        drain(jq)
        print(sum(1 for _ in jq.list_jobs(status="completed", limit=1000)))
    """
)


@pytest.mark.parametrize("python", ["current", "3.12.0-3.12.3"])
def test_enqueue_and_run_raise_no_deprecation_warning(tmp_path: Path, python):
    interpreter = (
        sys.executable
        if python == "current"
        else str(python_with_jobkeeper("3.12", patches=range(4)))
    )
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [interpreter, "-W", "error::DeprecationWarning", str(script), f"sqlite:///{tmp_path}/j.db"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["57"]
