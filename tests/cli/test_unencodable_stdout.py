"""The CLI on a stdout (and stderr) whose encoding cannot take a job's text.

Found by a break-test: with ``PYTHONIOENCODING=cp1252``, ``enqueue
--json`` stored its job, then failed writing it (``UnicodeEncodeError``,
exit 1: a script that retried made a duplicate); ``jobs show`` and ``jobs
show --json`` failed alike. Such characters are now written as JSON escapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jobkeeper import JobQueue
from jobkeeper.cli.streams import ESCAPE_ERRORS
from support.cli import Cli

ARGS = {"a": "日本", "b": 1, "c": "😀 é \u0081"}


def run_in(encoding: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m jobkeeper ARGS`` with stdout and stderr in ``encoding``."""
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", *args],
        capture_output=True,
        encoding=encoding,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": encoding},
    )


@pytest.mark.parametrize("encoding", ["cp1252", "ascii"])
def test_output_on_a_stdout_that_cannot_encode_it(cli: Cli, encoding: str) -> None:
    def run(*args: str) -> str:
        done = run_in(encoding, "--database", cli.url, *args)
        # enqueue's warnings (no --app, no live worker) are all it says on stderr.
        said = [line for line in done.stderr.splitlines() if not line.startswith("warning: ")]
        assert (done.returncode, said) == (0, []), done.stderr
        return done.stdout

    enqueued = json.loads(run("enqueue", "add", "--args", json.dumps(ARGS), "--json"))
    assert enqueued["args"] == ARGS
    with JobQueue(cli.url) as jq:
        assert [job.id for job in jq.list_jobs()] == [enqueued["id"]]  # once
    job_id = str(enqueued["id"])
    assert json.loads(run("jobs", "show", job_id, "--json"))["args"] == ARGS
    assert json.loads(run("jobs", "list", "--json"))[0]["args"] == ARGS
    shown = run("jobs", "show", job_id)
    assert '"\\u65e5\\u672c"' in shown and "\\ud83d\\ude00" in shown
    # Rich measured the escaped text, so the table's right border lines up.
    assert len({len(line) for line in shown.splitlines() if line.startswith("|")}) == 1

    # Errors quoting the input are written to stderr the same way.
    failed = run_in(encoding, "--database", cli.url, "enqueue", "add", "--queue", "日本")
    assert failed.returncode == 2
    assert "'\\u65e5\\u672c'" in failed.stderr and "Traceback" not in failed.stderr
    # stderr opens with backslashreplace, whose \xe9 and \U0001f600 are no
    # JSON escapes (a --log-format json line with one did not parse).
    failed = run_in(
        encoding, "--database", cli.url, "enqueue", "add", "--queue", "\u0101\U0001f600"
    )
    assert failed.returncode == 2
    assert "\\u0101\\ud83d\\ude00" in failed.stderr, failed.stderr


def test_the_escapes_keep_json_valid() -> None:
    text = json.dumps({"k": "日本 😀 é \udcff"}, ensure_ascii=False)
    for encoding in ("ascii", "cp1252", "latin-1"):
        written = text.encode(encoding, ESCAPE_ERRORS).decode(encoding)
        assert json.loads(written) == json.loads(text)
