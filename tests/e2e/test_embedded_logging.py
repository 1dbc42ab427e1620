"""``jq.run_worker()`` in a plain script logs as ``jobkeeper worker`` does,
unless the script set up logging of its own (newcomer break-test: the
docs' embedded worker printed nothing at all, not even a failed job).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import logging
import sys

from jobkeeper import JobQueue

{setup}
jq = JobQueue(sys.argv[1])
jq.migrate()


@jq.task(max_attempts=1)
def boom() -> None:
    raise ValueError("boom")


boom.enqueue()
jq.run_worker(burst=True)
print("done")
"""

#: A line as the CLI worker's text format writes it.
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) jobkeeper")


def _run(
    tmp_path: Path, db_url: str, setup: str = "", *, end: str = 'print("done")'
) -> subprocess.CompletedProcess[str]:
    """The script, with ``setup`` before the queue and ``end`` after run_worker."""
    (tmp_path / "script.py").write_text(SCRIPT.format(setup=setup).replace('print("done")', end))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBKEEPER_")}
    return subprocess.run(
        [sys.executable, "script.py", db_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_script_without_logging_gets_the_cli_workers_lines(db_url: str, tmp_path: Path):
    result = _run(tmp_path, db_url)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    lines = result.stderr.splitlines()
    assert lines and all(TEXT_LINE.match(line) for line in lines), result.stderr
    assert any(
        " INFO jobkeeper.worker: worker " in line and " started on " in line for line in lines
    )
    assert any("failed (no retry left)" in line and "ValueError: boom" in line for line in lines)
    assert any(" stopped: 1 claimed" in line for line in lines)


def test_logging_the_script_set_up_is_left_alone(db_url: str, tmp_path: Path):
    result = _run(
        tmp_path,
        db_url,
        "logging.basicConfig(level=logging.WARNING, format='MINE %(levelname)s %(message)s')",
    )
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    lines = result.stderr.splitlines()
    # Its own format and level: the failure, and no INFO start line.
    assert lines and all(line.startswith("MINE WARNING ") for line in lines), result.stderr
    assert any("ValueError: boom" in line for line in lines)


def test_a_handler_on_the_jobkeeper_logger_alone_is_left_alone(db_url: str, tmp_path: Path):
    result = _run(
        tmp_path, db_url, "logging.getLogger('jobkeeper').addHandler(logging.NullHandler())"
    )
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    assert result.stderr == ""


def test_the_workers_last_lines_come_before_what_the_caller_prints_next(
    db_url: str, tmp_path: Path
):
    # The lines go out through a writer thread; slowed here, the caller's
    # own output came first (a Django command's CommandError before the
    # worker's "stopped" line) until run_worker waited for them.
    setup = (
        "import time\n"
        "from jobkeeper.worker import log_output\n"
        "_write = log_output.StreamWriter._write\n"
        "def slow(self, batch):\n"
        "    time.sleep(0.3)\n"
        "    _write(self, batch)\n"
        "log_output.StreamWriter._write = slow\n"
    )
    result = _run(tmp_path, db_url, setup, end='print("AFTER", file=sys.stderr)')
    lines = result.stderr.splitlines()
    assert result.returncode == 0 and lines, result.stderr
    assert lines[-1] == "AFTER", result.stderr
    assert any(" stopped" in line for line in lines[:-1]), result.stderr
