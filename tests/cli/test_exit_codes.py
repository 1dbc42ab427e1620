"""The ``jobkeeper`` command's exit codes on both backends: 0 ok, 2 bad input
with one line on stderr and nothing written, 1 other; and the real entry
point, ``python -m jobkeeper``, in subprocesses.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.helpers import claim, complete, fail, total_rows
from jobkeeper import JobQueue, JobStatus
from jobkeeper.backends.sqlite.backend import MIGRATIONS
from support.cli import Cli
from support.db import count

from .helpers import LATEST, assert_one_line_error, run_module

# -- bad input: exit 2, one line, nothing written -----------------------------------------------

BAD_ENQUEUES = [
    (["--args", "{not json"], "--args is not valid JSON"),
    (["--args", '{"x": NaN}'], "NaN"),
    (["--args", '{"x": Infinity}'], "Infinity"),
    (["--args", '{"x": -Infinity}'], "Infinity"),
    (["--args", '{"a": [1, {"b": NaN}]}'], "NaN"),
    (["--args", "[1]"], "must be a JSON object"),
    (["--args", '"text"'], "must be a JSON object"),
    (["--args", "null"], "must be a JSON object"),
    (["--args", '{"a": 1, "a": 2}'], "duplicate key 'a'"),
    (["--args", '{"s": "a\\u0000b"}'], "args.s"),
    (["--args", '{"s": "\\ud800"}'], "lone surrogate"),
    (["--args", "[" * 100_000 + "]" * 100_000], "--args"),
    (["--args", '{"x": ' + "1" * 5000 + "}"], "--args: args.x is an integer of 5000 digits"),
    (["--delay", "-1"], "--delay must be a finite number of seconds >= 0, got -1"),
    (["--delay", "-0.5"], "--delay must"),
    (["--delay", "1e10"], "--delay=10000000000.0 seconds is more than the limit"),
    (["--delay", "nan"], "--delay"),
    (["--delay", "inf"], "--delay"),
    (["--delay", "soon"], "--delay"),
    (["--run-at", "2030-01-01T09:00:00"], "--run-at '2030-01-01T09:00:00': give its offset"),
    (["--run-at", "tomorrow"], "--run-at 'tomorrow': not an ISO 8601 time"),
    (["--run-at", "2030-01-01T09:00:00Z", "--delay", "5"], "--run-at or --delay"),
    (["--priority", "99999999999"], "--priority must be an int between"),
    (["--max-attempts", "0"], "--max-attempts must be an int between 1 and"),
    (["--queue", "has space"], "queue name"),
    (["--unique-key", ""], "--unique-key must be a non-empty string"),
    (["--bogus"], "--bogus"),
    (["--args"], "--args"),
]


def test_bad_enqueue_input_exits_2_with_one_line_and_writes_nothing(cli, queue):
    for extra, needle in BAD_ENQUEUES:
        code, out, err = cli("enqueue", "task", *extra)
        assert code == 2, (extra, out, err)
        assert_one_line_error(err, needle)
        assert out == "", extra
    assert total_rows(queue) == 0


def test_nested_nan_names_the_path(cli, queue):
    code, _, err = cli("enqueue", "task", "--args", '{"a": [1, {"b": 1e999}]}')
    assert code == 2
    assert_one_line_error(err, "--args: args.a[1].b is 1e999, too large for a 64-bit float")
    assert total_rows(queue) == 0


OTHER_BAD_INPUT = [
    ["enqueue", "bad task name"],
    ["jobs", "list", "--status", "finished"],
    ["jobs", "list", "--status", "DEAD"],
    ["jobs", "list", "--limit", "0"],
    ["jobs", "list", "--limit", "many"],
    ["jobs", "show", "abc"],
    ["jobs", "show"],
    ["retry", "x"],
    ["cancel", "-5"],
    ["dead", "requeue"],
    ["dead", "requeue", "1", "--all"],
    ["status", "--bogus"],
    ["nonsense-command"],
    ["jobs"],
    ["dead"],
    [],
]


def test_other_bad_input_exits_2_with_one_line(cli, queue):
    job = queue.enqueue("t", {})
    for args in OTHER_BAD_INPUT:
        code, _, err = cli(*args)
        assert code == 2, (args, err)
        assert_one_line_error(err)
    assert total_rows(queue) == 1
    assert queue.get_job(job.id).status == JobStatus.AVAILABLE  # type: ignore[union-attr]


def test_error_lines_print_the_quoted_input_literally(cli, queue):
    # Error lines quote the input; "[/]" in it was read as Rich markup, which
    # crashed with a traceback (exit 1) instead of the one-line error.
    for args, needle in (
        (["jobs", "list", "--status", "[/]"], "--status '[/]'"),
        (["enqueue", "t", "--queue", "[/]"], "'[/]'"),
        (["enqueue", "t", "--priority", "[red]1"], "'[red]1'"),
    ):
        code, out, err = cli(*args)
        assert code == 2, (args, err)
        assert_one_line_error(err, needle)
        assert out == "", args
    assert total_rows(queue) == 0


def test_errors_name_the_cli_option_not_the_python_argument(cli, queue):
    # helper-77: these named worker_id, delay/run_at, or asked for options
    # when the queue name itself was the fault.
    for args, needle in (
        (["jobs", "list", "--worker", ""], "--worker must name a worker id"),
        (
            ["enqueue", "t", "--run-at", "2030-01-01T00:00:00Z", "--delay", "5"],
            "--run-at or --delay",
        ),
        (["queues", "set", "", "--concurrency", "1"], "queue name '' is invalid"),
        (["queues", "set", ""], "queue name '' is invalid"),
    ):
        code, out, err = cli(*args)
        assert code == 2, (args, err)
        assert_one_line_error(err, needle)
        assert out == "", args
    assert total_rows(queue) == 0


def test_negative_job_ids_get_the_id_check_not_no_such_option(cli, queue):
    # "-1" is a job id, not an unknown option ("No such option: -1").
    job = queue.enqueue("t", {})
    for args in (
        ["jobs", "show", "-1"],
        ["retry", "-5"],
        ["cancel", "-1"],
        ["dead", "requeue", "-3"],
        ["dead", "requeue", str(job.id), "-3"],
        ["jobs", "list", "--after", "-5"],
    ):
        code, out, err = cli(*args)
        assert code == 2, (args, err)
        assert_one_line_error(err, "is not a job id: expected a whole number from 1 up")
        assert out == "", args
    assert queue.get_job(job.id).status == JobStatus.AVAILABLE  # type: ignore[union-attr]


BAD_URLS = [
    ("redis://localhost/0", "unknown scheme"),
    ("sqlite://", "invalid SQLite URL"),
    ("sqlite:///:memory:", "needs a database file"),
    ("mysql://u@localhost/db", "not supported yet"),
    ("not a url", "invalid database URL"),
    ("postgresql://u@h/db?nonsense_option=1", "invalid PostgreSQL URL"),
    ("postgresql://u@127.0.0.1:port/db", "not a port number"),
    # libpq accepts it; the connect error then could not even be worded.
    ("postgresql://[/]", "invalid PostgreSQL URL"),
]


@pytest.mark.parametrize("command", [["migrate"], ["status"], ["enqueue", "t"]])
def test_invalid_database_url_exits_2(capsys, command):
    for url, needle in BAD_URLS:
        code, out, err = Cli(url, capsys)(*command)
        assert code == 2, (url, err)
        assert_one_line_error(err, needle)
        assert out == ""


def test_unknown_root_option_exits_2(capsys):
    code, _, err = Cli("", capsys)("--bogus", "status", database=False)
    assert code == 2
    assert_one_line_error(err, "--bogus")


# -- other failures: exit 1 -----------------------------------------------------------------


def test_unknown_job_id_exits_1(cli):
    for args in (
        ["jobs", "show", "987654"],
        ["retry", "987654"],
        ["cancel", "987654"],
        ["dead", "requeue", "987654"],
    ):
        code, out, err = cli(*args)
        assert code == 1, (args, err)
        assert_one_line_error(err, "987654")
        assert out == "", (args, out)


def test_wrong_state_exits_1_and_changes_nothing(cli, queue):
    job = queue.enqueue("t", {})
    code, _, err = cli("retry", str(job.id))
    assert code == 1
    assert_one_line_error(err, "available")
    done = queue.enqueue("t", {}, queue="c")
    (running,) = claim(queue, "c")
    complete(queue, running)
    code, _, err = cli("cancel", str(done.id))
    assert code == 1
    assert_one_line_error(err, "completed")
    assert queue.get_job(job.id).status == JobStatus.AVAILABLE  # type: ignore[union-attr]
    assert queue.get_job(done.id).status == JobStatus.COMPLETED  # type: ignore[union-attr]


def test_unmigrated_database_exits_1_saying_migrate(db_url, capsys):
    code, _, err = Cli(db_url, capsys)("status")
    assert code == 1
    assert_one_line_error(err, "migrate")


def test_retryable_job_can_be_retried_from_the_cli(cli, queue):
    job = queue.enqueue("t", {})
    (running,) = claim(queue)
    fail(queue, running, retry_in=3600)
    assert "available" in cli.ok("retry", str(job.id))
    again = queue.get_job(job.id)
    assert again is not None and again.attempt == 0 and len(again.errors) == 1


# -- the real entry point in subprocesses ----------------------------------------------------


def test_the_migrate_command_an_error_names_migrates_the_apps_database(db_url, tmp_path):
    # Found by a break-test: a worker whose --app names a database of its own
    # said "run `jobkeeper migrate`", which migrated the default one instead.
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    url = "sqlite:///shop.db" if db_url.startswith("sqlite") else db_url
    (project / "app.py").write_text(f"from jobkeeper import JobQueue\njq = JobQueue({url!r})\n")
    worker = [sys.executable, "-m", "jobkeeper", "worker", "--app", "app:jq", "--burst"]
    refused = subprocess.run(worker, cwd=project, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused.stderr
    hint = re.search(r"run `(jobkeeper [^`]+ migrate)`", refused.stderr)
    assert hint is not None and "--database" in hint[1], refused.stderr
    argv = shlex.split(hint[1])
    done = subprocess.run(
        [sys.executable, "-m", *argv], cwd=elsewhere, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert not (elsewhere / "jobkeeper.db").exists()
    ran = subprocess.run(worker, cwd=project, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr


def test_subprocess_enqueue_show_and_exit_codes(db_url):
    with JobQueue(db_url) as jq:
        jq.migrate()
    done = run_module("--database", db_url, "enqueue", "resize", "--args", '{"w": 1}')
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.strip())
    shown = run_module("--database", db_url, "jobs", "show", str(job_id), "--json")
    assert shown.returncode == 0
    assert json.loads(shown.stdout)["args"] == {"w": 1}

    bad = run_module("--database", db_url, "enqueue", "resize", "--args", '{"x": NaN}')
    assert bad.returncode == 2
    assert_one_line_error(bad.stderr, "NaN")
    missing = run_module("--database", db_url, "jobs", "show", "424242")
    assert missing.returncode == 1
    assert_one_line_error(missing.stderr, "424242")
    unknown = run_module("--database", db_url, "enqueue", "resize", "--bogus")
    assert unknown.returncode == 2
    assert_one_line_error(unknown.stderr, "--bogus")
    with JobQueue(db_url) as jq:
        assert total_rows(jq) == 1


def test_subprocess_uses_the_environment_url(sqlite_url):
    env = {"JOBKEEPER_DATABASE_URL": sqlite_url}
    assert run_module("migrate", env=env).returncode == 0
    done = run_module("enqueue", "t", env=env)
    assert done.returncode == 0, done.stderr
    with JobQueue(sqlite_url) as jq:
        assert jq.get_job(int(done.stdout)) is not None
    bad = run_module("status", env={"JOBKEEPER_DATABASE_URL": "nope"})
    assert bad.returncode == 2
    assert_one_line_error(bad.stderr, "invalid database URL")


def test_four_concurrent_migrate_processes(db_url):
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: run_module("--database", db_url, "migrate"), range(4)))
    assert [r.returncode for r in results] == [0, 0, 0, 0], [r.stderr for r in results]
    assert all(f"schema at version {LATEST}" in r.stdout for r in results)
    with JobQueue(db_url) as jq:
        assert count(jq, "jobkeeper_schema") == len(MIGRATIONS)
        assert jq.backend.schema_version() == LATEST


def test_human_output_prints_data_literally_not_as_markup(cli, queue):
    """Args, keys and error texts like "[/]" or "list[int]" are data: printed
    as they are, never parsed as Rich markup (which crashed on "[/]")."""
    args = {"s": "[/] and [red]x[/red]", "t": "list[int]"}
    job = queue.enqueue("t", args, unique_key="[/]")
    (running,) = claim(queue)
    fail(queue, running, retry_in=3600, error="[/bold] list[int] [Errno 2]")
    shown = cli.ok("jobs", "show", str(job.id))
    flat = "".join(shown.split())  # the table may fold long values
    assert "".join(json.dumps(args).split()) in flat
    assert "[/bold]list[int][Errno2]" in flat
    listed = cli.ok("jobs", "list")
    assert "list[int]" in "".join(listed.split())
