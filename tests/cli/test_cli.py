"""The ``jobkeeper`` command on both backends: output, ``--json`` shapes, exit
codes (0 ok, 2 bad input with one line on stderr and nothing written, 1 other).

Most cases call ``jobkeeper.cli.main.main`` in-process (fast); a few run the
real entry point, ``python -m jobkeeper``, in subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from rich.console import Console

from backends.helpers import claim, complete, fail, kill, register, total_rows
from jobkeeper import JobQueue, JobStatus
from jobkeeper.backends.sqlite.backend import MIGRATIONS
from jobkeeper.cli.main import main
from support.cli import Cli
from support.db import count, is_pg, sql

#: The newest schema version (both backends number migrations alike).
LATEST = MIGRATIONS[-1][0]

JOB_KEYS = {
    "id",
    "task",
    "args",
    "queue",
    "status",
    "priority",
    "attempt",
    "max_attempts",
    "fence",
    "unstarted_returns",
    "serial_key",
    "run_alone",
    "crashes",
    "alone_fence",
    "scheduled_at",
    "created_at",
    "attempted_at",
    "finished_at",
    "worker_id",
    "unique_key",
    "errors",
    "result",
    "cancel_requested",
    "dead_reason",
    "args_error",
    "trace_context",
}
STATUSES = [s.value for s in JobStatus]


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli.migrated(db_url, capsys)


@pytest.fixture
def queue(cli: Cli):
    with JobQueue(cli.url) as jq:
        yield jq


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert lines[0][len("error: ") :].strip(), err
    for needle in needles:
        assert needle in lines[0], err


# -- happy paths -----------------------------------------------------------------------


def test_migrate_is_idempotent(cli):
    assert f"schema at version {LATEST}" in cli.ok("migrate")
    assert f"schema at version {LATEST}" in cli.ok("migrate")


def test_enqueue_prints_the_new_id(cli, queue):
    out = cli.ok("enqueue", "resize", "--args", '{"path": "a.png", "width": 100}')
    job_id = int(out.strip())
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.task, job.args, job.queue, job.status) == (
        "resize",
        {"path": "a.png", "width": 100},
        "default",
        JobStatus.AVAILABLE,
    )
    second = int(cli.ok("enqueue", "resize").strip())
    assert second > job_id
    assert queue.get_job(second).args == {}  # type: ignore[union-attr]


def test_enqueue_json_shows_where_the_job_went(cli, queue):
    # helper-67: without --app the job went to `default` and only its id
    # was printed; --json shows the stored job, queue and status included.
    shown = cli.json("enqueue", "mail", "--args", '{"to": "x"}', "--delay", "60", "--json")
    stored = queue.get_job(shown["id"])
    assert stored is not None and shown == stored.to_dict()
    assert (shown["queue"], shown["status"], shown["args"]) == ("default", "scheduled", {"to": "x"})


def test_enqueue_options(cli, queue):
    out = cli.ok(
        "enqueue",
        "mail",
        "--args",
        '{"to": "x@example.com", "n": 1.5, "ok": true, "none": null, "u": "😀"}',
        "--queue",
        "emails",
        "--delay",
        "120",
        "--priority",
        "-4",
        "--max-attempts",
        "3",
        "--unique-key",
        "k1",
    )
    job = queue.get_job(int(out))
    assert job is not None
    assert job.args == {"to": "x@example.com", "n": 1.5, "ok": True, "none": None, "u": "😀"}
    assert (job.queue, job.priority, job.max_attempts, job.unique_key) == ("emails", -4, 3, "k1")
    assert job.status == JobStatus.SCHEDULED
    assert int(cli.ok("enqueue", "mail", "--unique-key", "k1")) == job.id


def test_enqueue_run_at_takes_an_iso_time_with_its_offset(cli, queue):
    out = cli.ok("enqueue", "mail", "--run-at", "2030-01-01T09:00:00+01:00")
    job = queue.get_job(int(out))
    assert job is not None and job.status == JobStatus.SCHEDULED
    assert job.scheduled_at == datetime(2030, 1, 1, 8, 0, tzinfo=UTC)
    out = cli.ok("enqueue", "mail", "--run-at", "2000-01-01T00:00:00Z")  # past: runs now
    job = queue.get_job(int(out))
    assert job is not None and job.status == JobStatus.AVAILABLE


def test_status_json_is_stable(cli, queue):
    empty = cli.json("status")
    assert empty == {"queues": {}, "totals": dict.fromkeys(STATUSES, 0), "workers": []}
    queue.enqueue("t", {}, queue="a")
    queue.enqueue("t", {}, queue="b", delay=60)
    kill(queue, queue.enqueue("t", {}, queue="b"))
    status = cli.json("status")
    assert list(status) == ["queues", "totals", "workers"]
    assert sorted(status["queues"]) == ["a", "b"]
    for per_status in status["queues"].values():
        assert list(per_status) == STATUSES
    assert status["queues"]["a"]["available"] == 1
    assert status["queues"]["b"]["scheduled"] == 1
    assert status["queues"]["b"]["dead"] == 1
    assert status["totals"] == {
        **dict.fromkeys(STATUSES, 0),
        "available": 1,
        "scheduled": 1,
        "dead": 1,
    }
    # The worker registered by kill() is listed with its fields.
    (worker,) = status["workers"]
    assert set(worker) == {
        "id",
        "hostname",
        "pid",
        "queues",
        "started_at",
        "heartbeat_at",
        "heartbeat_age",
        "stale",
        "rescue_after",
        "version",
    }
    assert worker["stale"] is False
    assert "jobs by queue and status" in cli.ok("status")  # the human tables render


def test_jobs_list_and_show_json(cli, queue):
    a = queue.enqueue("t", {"n": 1}, queue="a")
    b = queue.enqueue("u", {"n": 2}, queue="b")
    listed = cli.json("jobs", "list")
    assert [j["id"] for j in listed] == [b.id, a.id]
    for job in listed:
        assert set(job) == JOB_KEYS
    assert [j["id"] for j in cli.json("jobs", "list", "--queue", "a")] == [a.id]
    assert [j["id"] for j in cli.json("jobs", "list", "--status", "available", "--limit", "1")] == [
        b.id
    ]
    assert cli.json("jobs", "list", "--status", "running") == []
    shown = cli.json("jobs", "show", str(a.id))
    assert set(shown) == JOB_KEYS | {"waiting"}
    assert shown["id"] == a.id
    assert shown["args"] == {"n": 1}
    assert shown["status"] == "available"
    assert shown["scheduled_at"].endswith("+00:00")
    # The job's fields, plus why it waits (issue 15: here, no worker serves "a").
    assert shown.pop("waiting")[0]["code"] == "no_worker"
    assert shown == json.loads(json.dumps(queue.get_job(a.id).to_dict()))  # type: ignore[union-attr]
    human = cli.ok("jobs", "show", str(a.id))
    assert str(a.id) in human
    table = cli.ok("jobs", "list")
    assert str(b.id) in table and "available" in table


def test_jobs_show_dead_and_completed(cli, queue):
    dead = kill(queue, queue.enqueue("t", {}, queue="d"))
    done = queue.enqueue("t", {}, queue="c")
    (running,) = claim(queue, "c")
    complete(queue, running, '{"answer":42}')
    shown = cli.json("jobs", "show", str(dead.id))
    assert shown["status"] == "dead"
    assert shown["dead_reason"] == "boom"
    assert [e["error"] for e in shown["errors"]] == ["boom"]
    shown = cli.json("jobs", "show", str(done.id))
    assert (shown["status"], shown["result"]) == ("completed", {"answer": 42})


def test_jobs_show_and_list_print_no_control_characters(cli, queue):
    # A job's error holds what its task raised: an ESC sequence there reached
    # the terminal raw (helper-77), and a newline broke the table's row.
    job = queue.enqueue("t", {}, queue="esc")
    (running,) = claim(queue, "esc")
    fail(queue, running, "dead", error="bad\x1b[2J\x1b[31mred\nnext line\x9b2J\u202e")
    for argv in (["jobs", "show", str(job.id)], ["dead", "list"]):
        out = cli.ok(*argv)
        assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out, argv
        assert "\\x1b[2J" in out.replace("\n", "").replace(" ", "").replace("│", ""), argv
    # --json: the same text, its C1 and bidi characters as JSON escapes.
    out = cli.ok("jobs", "show", str(job.id), "--json")
    assert "\x9b" not in out and "\u202e" not in out
    assert json.loads(out)["errors"][0]["error"].endswith("\x9b2J\u202e")


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--database", "sqlite:///x.db"],
        ["jobs", "list", "--database=sqlite:///x.db"],
        ["worker", "--app", "a:b", "--database", "sqlite:///x.db"],
    ],
)
def test_database_after_the_command_says_where_it_goes(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert_one_line_error(
        capsys.readouterr().err, "--database", "goes before the command: jobkeeper --database URL"
    )


def test_jobs_show_says_when_it_cuts_a_long_result(cli, queue):
    job = queue.enqueue("t", {})
    (running,) = claim(queue, "default")
    complete(queue, running, json.dumps({"text": "x" * 5000}))
    out = cli.ok("jobs", "show", str(job.id))
    # The table folds long values over lines between its borders.
    flat = "".join(c for c in "".join(out.split()) if not "\u2500" <= c <= "\u257f")
    assert "x" * 1900 in flat
    assert "morecharacters;--jsonshowsall" in flat
    assert "3,012" in flat  # 5,012 characters of JSON, 2,000 shown
    assert cli.json("jobs", "show", str(job.id))["result"] == {"text": "x" * 5000}


def test_dead_list_retry_cancel_and_requeue(cli, queue):
    d1 = kill(queue, queue.enqueue("t", {"n": 1}))
    d2 = kill(queue, queue.enqueue("t", {"n": 2}))
    d3 = kill(queue, queue.enqueue("t", {"n": 3}))
    listed = cli.json("dead", "list")
    assert [j["id"] for j in listed] == [d3.id, d2.id, d1.id]
    assert all(set(j) == JOB_KEYS and j["status"] == "dead" for j in listed)

    assert "available" in cli.ok("retry", str(d1.id))
    assert queue.get_job(d1.id).status == JobStatus.AVAILABLE  # type: ignore[union-attr]

    out = cli.ok("dead", "requeue", str(d2.id))
    assert f"requeued 1 job: {d2.id}" in out
    assert "requeued 1 job" in cli.ok("dead", "requeue", "--all", "--yes")
    assert cli.json("dead", "list") == []
    assert count(queue, "jobkeeper_dead_letters") == 0

    assert "cancelled" in cli.ok("cancel", str(d3.id))
    assert queue.get_job(d3.id).status == JobStatus.CANCELLED  # type: ignore[union-attr]


def test_claimed_jobs_are_a_status_of_their_own(cli, queue):
    # Prefetched (claimed, not started) jobs are not running.
    job = queue.enqueue("t", {})
    claim(queue)
    assert [j["id"] for j in cli.json("jobs", "list", "--status", "claimed")] == [job.id]
    assert cli.json("jobs", "list", "--status", "running") == []
    status = cli.json("status")
    assert status["totals"]["claimed"] == 1 and status["totals"]["running"] == 0
    assert "claimed" in cli.ok("status")
    shown = cli.json("jobs", "show", str(job.id))
    assert (shown["status"], shown["fence"]) == ("claimed", 1)


def test_cancel_running_job_reports_the_request(cli, queue):
    job = queue.enqueue("t", {})
    claim(queue)
    out = cli.ok("cancel", str(job.id))
    assert "claimed" in out and "cancel requested" in out


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


# -- --database with an app ----------------------------------------------------------------

CHAIN_APP = """
from jobkeeper import JobQueue

jq = JobQueue(heartbeat_interval=0.1, rescue_after=1, poll_interval=0.05)


@jq.task(queue="chain", max_attempts=4)
def parent(n: int) -> int:
    return child.enqueue(n=n + 1).id


@jq.task(queue="chain")
def child(n: int) -> int:
    return n * 10
"""


def test_worker_database_option_carries_follow_up_jobs_to_that_database(db_url, tmp_path):
    # The app creates JobQueue() with no URL; `--database` must reach it, so
    # that jobs its tasks enqueue go to the database the worker serves, not
    # to ./jobkeeper.db (newcomer report P2).
    (tmp_path / "chainapp.py").write_text(CHAIN_APP)
    env = {"PYTHONPATH": str(tmp_path), "JOBKEEPER_DATABASE_URL": ""}
    base = [sys.executable, "-m", "jobkeeper", "--database", db_url]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, **env},
        )  # fmt: skip

    assert run("migrate").returncode == 0
    enqueued = run("enqueue", "parent", "--args", '{"n": 5}', "--app", "chainapp:jq")
    assert enqueued.returncode == 0, enqueued.stderr
    worker = run("worker", "--app", "chainapp:jq", "--burst", "--log-level", "WARNING")
    assert worker.returncode == 0, worker.stderr
    with JobQueue(db_url) as jq:
        parent_job = jq.get_job(int(enqueued.stdout.strip()))
        assert parent_job is not None and parent_job.status == JobStatus.COMPLETED
        # The task's own settings applied at enqueue (--app), and the worker
        # served the app's queue without --queue.
        assert parent_job.queue == "chain" and parent_job.max_attempts == 4
        child_job = jq.get_job(parent_job.result)
        assert child_job is not None and child_job.status == JobStatus.COMPLETED
        assert child_job.result == 60
    assert not (tmp_path / "jobkeeper.db").exists()


def test_worker_database_option_repoints_an_app_bound_to_another_database(db_url, tmp_path):
    # An app that names its own URL still runs on --database, tasks and their
    # follow-up jobs included.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    (tmp_path / "boundapp.py").write_text(
        CHAIN_APP.replace("JobQueue(", f"JobQueue({other!r}, ", 1)
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    base = [sys.executable, "-m", "jobkeeper", "--database", db_url]
    for args in (
        ["migrate"],
        ["enqueue", "parent", "--args", '{"n": 1}', "--app", "boundapp:jq"],
        ["worker", "--app", "boundapp:jq", "--burst", "--log-level", "WARNING"],
    ):
        done = subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
        )
        assert done.returncode == 0, done.stderr
    with JobQueue(db_url) as jq:
        assert [j.status for j in jq.list_jobs()] == [JobStatus.COMPLETED] * 2
    assert not (tmp_path / "other.db").exists()


def test_enqueue_with_app_checks_arguments(cli, tmp_path, monkeypatch):
    (tmp_path / "checkapp.py").write_text(CHAIN_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("JOBKEEPER_DATABASE_URL", cli.url)
    code, _, err = cli("enqueue", "parent", "--args", '{"wrong": 1}', "--app", "checkapp:jq")
    assert code == 2
    assert_one_line_error(err, "parent")


# -- user reports: unknown task with --app, app import errors, requeue output, long
# -- integers, stale workers -----------------------------------------------------------------

MANY_TASKS_APP = "from jobkeeper import JobQueue\n\njq = JobQueue()\n" + "".join(
    f"\n\n@jq.task\ndef task_{i:02}() -> None: ...\n" for i in range(12)
)


def test_enqueue_with_app_refuses_an_unknown_task(cli, queue, tmp_path, monkeypatch):
    (tmp_path / "unknowntaskapp.py").write_text(CHAIN_APP)
    (tmp_path / "manytasksapp.py").write_text(MANY_TASKS_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = cli("enqueue", "nosuch", "--app", "unknowntaskapp:jq")
    assert code == 2, err
    assert_one_line_error(err, "'nosuch'", "unknowntaskapp:jq", "child, parent")
    assert out == ""
    # A long list of tasks is cut, saying how many more there are.
    code, out, err = cli("enqueue", "nosuch", "--app", "manytasksapp:jq")
    assert code == 2, err
    assert_one_line_error(err, "'nosuch'", "task_00", "task_09", "and 2 more")
    assert "task_10" not in err
    assert total_rows(queue) == 0
    # The app's own tasks still enqueue, and without --app any name does.
    assert int(cli.ok("enqueue", "child", "--args", '{"n": 1}', "--app", "unknowntaskapp:jq"))
    assert int(cli.ok("enqueue", "nosuch"))
    assert total_rows(queue) == 2


BAD_IMPORT_APPS = {
    "zerodivapp": (
        "raise ZeroDivisionError('division by zero')\n",
        "ZeroDivisionError: division by zero",
    ),
    "syntaxapp": ("def broken(:\n", "SyntaxError"),
    "exitapp": ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
    "bareapp": ("raise RuntimeError\n", "failed: RuntimeError"),
    "baseexcapp": (
        "class Stop(BaseException):\n    pass\nraise Stop('custom')\n",
        "Stop: custom",
    ),
}


def assert_app_traceback(err: str, path: object, line: int, *needles: str) -> None:
    """The app's traceback (its file and line, no import machinery), then
    one error line naming the failure.
    """
    *trace, last = err.strip().splitlines()
    assert trace, err
    assert f'File "{path}", line {line}' in "\n".join(trace), err
    assert "importlib" not in "\n".join(trace), err
    assert_one_line_error(last, *needles)


@pytest.mark.parametrize("command", ["worker", "enqueue"])
def test_app_that_raises_while_imported_exits_2_with_its_traceback(
    cli, queue, tmp_path, monkeypatch, command
):
    for name, (source, _) in BAD_IMPORT_APPS.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, (source, needle) in BAD_IMPORT_APPS.items():
        args = ["worker", "--burst"] if command == "worker" else ["enqueue", "t"]
        code, out, err = cli(*args, "--app", f"{name}:jq")
        assert code == 2, (name, err)
        # The line that raised: the last line of the module.
        line = len(source.splitlines())
        assert_app_traceback(
            err, tmp_path / f"{name}.py", line, f"importing app '{name}:jq' failed", needle
        )
        assert out == ""
    assert total_rows(queue) == 0


@pytest.mark.parametrize("command", ["worker", "doctor"])
def test_app_that_migrates_at_import_with_the_database_down_is_a_database_error(
    tmp_path, monkeypatch, capsys, command
):
    # The README's own pattern (migrate() at module level) with the database
    # down: this was "bad input" (exit 2) located in contextlib.py, a frame
    # of jobkeeper's own context managers, instead of the app's line.
    (tmp_path / "migratingapp.py").write_text(
        "from jobkeeper import JobQueue\n\njq = JobQueue()\njq.migrate()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    down = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=1"
    args = ["--burst"] if command == "worker" else []
    with pytest.raises(SystemExit) as info:
        main(["--database", down, command, "--app", "migratingapp:jq", *args])
    assert info.value.code == 1
    assert_one_line_error(
        capsys.readouterr().err,
        "importing app 'migratingapp:jq' failed",
        "is unavailable",
        f"(at {tmp_path / 'migratingapp.py'}:4)",
    )


def test_app_whose_jobqueue_settings_are_refused_says_where_in_one_line(cli, tmp_path, monkeypatch):
    # jobkeeper's own refusal already says what is wrong: one line, with the
    # app's file and line, not a traceback through jobkeeper's internals.
    source = (
        "from jobkeeper import JobQueue\n\njq = JobQueue(heartbeat_interval=5, rescue_after=4)\n"
    )
    (tmp_path / "cfgapp.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = cli("worker", "--burst", "--app", "cfgapp:jq")
    assert code == 2
    assert_one_line_error(err, "ConfigError: rescue_after=4", f"(at {tmp_path / 'cfgapp.py'}:3)")


def test_app_importing_a_missing_dependency_shows_where(cli, tmp_path, monkeypatch):
    # A ModuleNotFoundError from inside the app is the app's bug (file and
    # line shown); the app module itself missing stays one line.
    (tmp_path / "depapp.py").write_text("import os\nimport no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = cli("worker", "--burst", "--app", "depapp:jq")
    assert code == 2
    assert_app_traceback(err, tmp_path / "depapp.py", 2, "No module named 'no_such_dependency_xyz'")
    code, _, err = cli("worker", "--burst", "--app", "no_such_app_module_xyz:jq")
    assert code == 2
    assert_one_line_error(err, "cannot import 'no_such_app_module_xyz'")


def test_subprocess_app_that_raises_while_imported_exits_2(db_url, tmp_path):
    (tmp_path / "badapp.py").write_text("x = 1 / 0\n")
    with JobQueue(db_url) as jq:
        jq.migrate()
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for args in (
        ["worker", "--app", "badapp:jq", "--burst"],
        ["enqueue", "t", "--app", "badapp:jq"],
    ):
        done = run_module("--database", db_url, *args, env=env)
        assert done.returncode == 2, done.stderr
        assert_app_traceback(
            done.stderr,
            tmp_path / "badapp.py",
            1,
            "importing app 'badapp:jq' failed: ZeroDivisionError: division by zero",
        )
        assert done.stdout == ""
    with JobQueue(db_url) as jq:
        assert total_rows(jq) == 0


def test_dead_requeue_reports_ids_that_are_not_dead_letters(cli, queue):
    live = queue.enqueue("t", {})
    dead = kill(queue, queue.enqueue("t", {}))
    # Nothing to requeue: no "requeued 0 jobs:" fragment, one error line, exit 1
    # (as for `jobs show` / `retry` / `cancel` of an unknown id).
    code, out, err = cli("dead", "requeue", "999", str(live.id))
    assert code == 1
    assert out == ""
    assert_one_line_error(err, f"not dead letters: {live.id} 999")
    # Some are dead letters: those are requeued and said so, the others named.
    code, out, err = cli("dead", "requeue", str(dead.id), "999")
    assert code == 1
    assert out.strip() == f"requeued 1 job: {dead.id}"
    assert_one_line_error(err, "not dead letters: 999")
    assert queue.get_job(dead.id).status == JobStatus.AVAILABLE  # type: ignore[union-attr]
    # --all with no dead letters is not an error and prints no dangling list.
    out = cli.ok("dead", "requeue", "--all", "-y")
    assert out.strip() == "requeued 0 jobs (there are no dead letters)"


def test_args_integer_past_the_digit_limit_names_the_field(cli, queue):
    huge = "1" * 5000
    for text, needle in (
        ('{"a": [1, {"b": ' + huge + "}]}", "args.a[1].b is an integer of 5000 digits"),
        ('{"a": -' + huge + "}", "args.a is an integer of 5000 digits"),
        ('{"odd key": ' + huge + "}", "args['odd key'] is an integer"),
        (huge, "args is an integer of 5000 digits"),
    ):
        code, out, err = cli("enqueue", "t", "--args", text)
        assert code == 2, err
        assert_one_line_error(err, "--args: ", needle, "more than 4300 digits are not supported")
        assert "set_int_max_str_digits" not in err
        assert out == ""
    # At the limit it is still an ordinary integer.
    job = queue.get_job(int(cli.ok("enqueue", "t", "--args", '{"n": ' + "9" * 18 + "}")))
    assert job is not None and job.args == {"n": 999_999_999_999_999_999}
    assert total_rows(queue) == 1


def test_status_marks_workers_without_a_recent_heartbeat_stale(cli, queue, monkeypatch):
    register(queue, "live-worker")
    register(queue, "dead-worker")
    # Age the dead worker's heartbeat by 300 s on the database clock (default
    # rescue_after is 60 s).
    if is_pg(queue):
        query = "UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - interval '300 seconds'"
    else:
        query = "UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - 300"
    sql(queue, query + " WHERE id = ?", ["dead-worker"])
    workers = {w["id"]: w for w in cli.json("status")["workers"]}
    assert workers["live-worker"]["stale"] is False
    assert 0 <= workers["live-worker"]["heartbeat_age"] < 60
    assert workers["dead-worker"]["stale"] is True
    assert 300 <= workers["dead-worker"]["heartbeat_age"] < 360
    # A console wide enough that the table's cells are not folded.
    monkeypatch.setattr("jobkeeper.cli.admin.console", Console(width=200))
    rows = {
        line.split("│")[1].strip(): line
        for line in cli.ok("status").splitlines()
        if "-worker " in line
    }
    assert rows["live-worker"].split("│")[5].strip() == "live"
    state = rows["dead-worker"].split("│")[5].strip()
    assert re.fullmatch(r"stale \(no heartbeat for 3[0-5]\ds\)", state), state


def test_tables_written_to_a_pipe_are_not_cut_to_80_columns(cli, queue):
    # Rich draws 80 columns when stdout is not a terminal: `jobs list > file`
    # showed "schedu…" and cut long task names.
    task = "some.rather.long.module.path:a_task_name_that_is_long"
    queue.enqueue(task, {}, delay=60)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-m", "jobkeeper", "--database", cli.url, "jobs", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert task in done.stdout and "scheduled" in done.stdout
    assert "…" not in done.stdout


# -- from a breaking run of the Click port ---------------------------------------------


def test_urls_and_paths_print_literally_not_as_markup(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x[").mkdir()
    for name in ("[red]y.db", "x[/].db"):
        code, out, err = Cli(f"sqlite:///{name}", capsys)("migrate")
        assert code == 0, err
        assert f"on sqlite:///{name}" in out
        assert (tmp_path / name).exists()


def test_empty_database_option_is_refused_with_app_too(db_url, tmp_path, monkeypatch, capsys):
    (tmp_path / "emptyurlapp.py").write_text(
        f"from jobkeeper import JobQueue\njq = JobQueue({db_url!r})\n"
        "@jq.task\ndef t() -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("JOBKEEPER_DATABASE_URL", db_url)
    with JobQueue(db_url) as jq:
        jq.migrate()
        for args in (
            ["enqueue", "t", "--app", "emptyurlapp:jq"],
            ["worker", "--burst", "--app", "emptyurlapp:jq"],
        ):
            code, out, err = Cli("", capsys)("--database", "", *args, database=False)
            assert code == 2, (args, err)
            assert out == ""
            assert_one_line_error(err, "invalid database URL ''")
        assert total_rows(jq) == 0


@pytest.mark.parametrize("prefetch", ["-1", "10001", "99999999999999999999"])
def test_worker_prefetch_out_of_range_exits_2_before_claiming(
    cli, queue, tmp_path, monkeypatch, prefetch
):
    (tmp_path / "prefetchapp.py").write_text(
        "from jobkeeper import JobQueue\njq = JobQueue()\n@jq.task\ndef t() -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    job = queue.enqueue("t")
    code, out, err = cli("worker", "--burst", "--app", "prefetchapp:jq", "--prefetch", prefetch)
    assert code == 2, err
    assert out == ""
    assert_one_line_error(err, "--prefetch must be an int between 0 and 10000", prefetch)
    assert "None" not in err, err  # the API's None is the option left out
    assert queue.get_job(job.id).status == JobStatus.AVAILABLE  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--workers", "0", "--workers must be between 2 and 64"),
        ("--workers", "1000", "--workers must be between 2 and 64"),
        ("--concurrency", "0", "--concurrency must be between 1 and 10000"),
    ],
)
def test_demo_bad_sizes_exit_2_before_writing(tmp_path, capsys, monkeypatch, option, value, needle):
    monkeypatch.chdir(tmp_path)
    code, out, err = Cli("", capsys)("demo", option, value, database=False)
    assert code == 2
    assert_one_line_error(err, needle, value)
    assert out == ""
    assert list(tmp_path.iterdir()) == []


def test_demo_on_a_named_sqlite_database_keeps_its_other_jobs(tmp_path, capsys, monkeypatch):
    from jobkeeper.demo import runner

    # A few files instead of the whole standard library: seconds, not minutes.
    files = runner.stdlib_files()[:24]
    monkeypatch.setattr(runner, "stdlib_files", lambda: files)
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    with JobQueue(url) as jq:
        jq.migrate()
        mine = jq.enqueue("my_task", {"n": 1}, queue="mine")
    code, out, err = Cli(url, capsys)("demo")
    assert code == 0, out + err
    assert "lost: 0" in out
    with JobQueue(url) as jq:
        kept = jq.get_job(mine.id)
        assert kept is not None and kept.args == {"n": 1} and kept.status == JobStatus.AVAILABLE


def test_jobs_list_help_names_every_status(capsys):
    code, out, _ = Cli("", capsys)("jobs", "list", "--help", database=False)
    assert code == 0
    text = " ".join(out.split())
    for status in STATUSES:
        assert status in text, status


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "show", "\u0661\u0662"],  # Arabic-Indic 12: int() takes it
        ["jobs", "show", " 1"],
        ["jobs", "show", "1_0"],
        ["dead", "requeue", "\u0661"],
        ["jobs", "list", "--limit", "\uff15"],  # fullwidth 5
        ["queues", "set", "default", "--concurrency", "\u0661\u0660"],
        ["queues", "set", "default", "--rate-limit", "\u0661\u0660/m"],
        ["queues", "set", "default", "--rate-limit", " 1/s"],
        ["queues", "set", "default", "--rate-limit", "1\n/s"],
        ["enqueue", "t", "--delay", "\u0661\u0662"],
        ["enqueue", "t", "--delay", "1_0"],
        ["dead", "purge", "--older-than", " 5"],
        ["periodic", "list", "--stale-after", "\uff15"],
        ["jobs", "show", "1" * 5000],  # past int()'s 4,300 digits: was a traceback
        ["queues", "set", "default", "--rate-limit", "1" * 5000 + "/s"],
        ["queues", "set", "default", "--concurrency", "1" * 5000],
    ],
)
def test_numbers_in_other_scripts_or_with_spaces_exit_2(cli, queue, argv):
    # Found by a break-test: int() read Arabic-Indic '12' as 12, so `jobs show`
    # showed job 12, and a queue got a limit of 10 from such a '10'.
    job = queue.enqueue("t", {})
    code, _, err = cli(*argv)
    assert code == 2, err
    assert queue.stats()["default"]["available"] == 1
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert queue.get_job(job.id).status == JobStatus.AVAILABLE  # type: ignore[union-attr]
    assert all(q.concurrency is None and q.rate_limit is None for q in queue.queues())


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["jobs", "show", "abc"], "'JOB_ID': 'abc' is not a job id"),
        (["retry", "x"], "'[JOB_ID]': 'x' is not a job id"),
        (["cancel", "1.5"], "'[JOB_ID]': '1.5' is not a job id"),
        (["dead", "requeue", "1", "y"], "'y' is not a job id"),
        (["dead", "purge", "z"], "'z' is not a job id"),
        (["jobs", "list", "--after", "z"], "'--after': 'z' is not a job id"),
        (["jobs", "list", "--limit", "many"], "'--limit': 'many' is not a whole number"),
        (["enqueue", "t", "--max-attempts", "m"], "'--max-attempts': 'm' is not a whole number"),
    ],
)
def test_a_non_number_where_negatives_are_never_valid_gets_no_minus_sign_hint(cli, argv, names):
    # Found by an earlier break-test: `jobs show abc` said
    # "(ASCII digits, optionally after -)", as if a job id could start with "-".
    code, _, err = cli(*argv)
    assert code == 2, err
    assert_one_line_error(err, names, ": expected ")
    assert "-)" not in err and "minus" not in err and "e.g. -" not in err, err


def test_a_non_number_where_negatives_are_valid_says_how_to_write_one(cli):
    code, _, err = cli("enqueue", "t", "--priority", "p")
    assert code == 2, err
    assert_one_line_error(
        err, "'--priority': 'p' is not a whole number", "a minus sign in front if negative"
    )


@pytest.mark.parametrize(
    ("argv", "says", "not_"),
    [
        (
            ["enqueue", "t", "--delay", "-5"],
            "--delay must be a finite number of seconds >= 0, got -5",
            "-5.0",
        ),
        (["enqueue", "t", "--delay", "-1.5"], "got -1.5", None),
        (["enqueue", "t", "--delay", "1e400"], "'--delay': '1e400' is out of range", "inf"),
        (["enqueue", "t", "--delay", "5000000000"], "--delay=5000000000 seconds", "5000000000.0"),
        (["dead", "purge", "--older-than", "-5"], "--older-than must", "-5.0"),
        (["dead", "purge", "--older-than", "1e400"], "'--older-than': '1e400'", "inf"),
        (["periodic", "list", "--stale-after", "-5"], "--stale-after must", "-5.0"),
        (
            ["periodic", "prune", "--stale-after", "3"],
            "--stale-after=3 is below 15 seconds",
            "3.0",
        ),
        (["verify", "--minutes", "-5"], "--minutes", "-5.0"),
        (["verify", "--minutes", "1440.0001"], "got 1440.0001", None),
    ],
)
def test_a_refused_number_of_seconds_is_echoed_as_typed(cli, queue, argv, says, not_):
    # Left over from an earlier break-test: `enqueue --delay -5` said "got -5.0"
    # (the CLI read every number of seconds as a float), `--delay 1e400` said
    # "--delay inf", and `verify --minutes 1440.0001` said "got 1440" (:g).
    code, _, err = cli(*argv)
    assert code == 2, err
    assert_one_line_error(err, says)
    assert not_ is None or not_ not in err, err
    assert total_rows(queue) == 0


def test_numbers_of_seconds_as_typed_still_work(cli, queue):
    assert cli.ok("enqueue", "t", "--delay", "5").strip().isdigit()
    assert cli.ok("enqueue", "t", "--delay", "1.5").strip().isdigit()
    assert cli.ok("enqueue", "t", "--delay", "1e2").strip().isdigit()
    assert queue.stats()["default"]["scheduled"] == 3
    assert "deleted 0 dead letters" in cli.ok("dead", "purge", "--older-than", "60", "--yes")
    assert "pruned 0 stale periodics" in cli.ok("periodic", "prune", "--stale-after", "15")
    assert cli.json("periodic", "list", "--stale-after", "2.5") == []


def test_a_cut_says_so_only_when_the_saying_is_shorter_than_the_cut():
    # Found by a break-test: an error 7 characters over the limit was cut and
    # followed by "(7 more characters; --json shows all)", longer than them.
    from jobkeeper.cli.render import _clip

    assert _clip("e" * 87, 80) == "e" * 87
    clipped = _clip("e" * 200, 80)
    assert clipped.startswith("e" * 80 + "…") and "120 more characters" in clipped


def test_times_of_the_year_one_keep_four_digits():
    from jobkeeper.cli.render import _when

    assert _when(datetime(1, 1, 1, 12, tzinfo=UTC)) == "0001-01-01 12:00:00"
    assert _when(datetime(2026, 12, 4, 9, 5, 7, 123456, tzinfo=UTC)) == "2026-12-04 09:05:07"
