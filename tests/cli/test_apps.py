"""``jobkeeper --app``: the app's database and ``--database``, its tasks,
its import errors, and the reports users made about them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from backends.helpers import kill, register, total_rows
from jobkeeper import JobQueue, JobStatus
from jobkeeper.cli.main import main
from support.db import is_pg, sql

from .helpers import assert_one_line_error, run_module

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
