"""``jobkeeper enqueue`` says on stderr what a newcomer cannot see: the task
settings it could not know without ``--app``, and a queue no live worker
serves. The job is enqueued all the same, exit 0, the id alone on stdout.

Newcomer break-test: with the quick start's ``resize`` (``queue="images",
max_attempts=5``) and ``jobkeeper worker --app myapp.jobs:jq`` running,
``jobkeeper enqueue resize --args ...`` printed the id and exited 0; the job
sat in ``default`` with 20 attempts, and never ran.
"""

from __future__ import annotations

import secrets

import pytest

from backends.helpers import register
from jobkeeper import JobQueue, JobStatus
from support.cli import Cli
from support.db import is_pg, sql

APP = """
from jobkeeper import JobQueue

jq = JobQueue()


@jq.task(queue="images", max_attempts=5)
def resize(path: str, width: int) -> dict:
    return {"path": path, "width": width}
"""

ARGS = '{"path": "s.png", "width": 1}'


def _warnings(err: str) -> list[str]:
    lines = err.splitlines()
    assert all(line.startswith("warning: ") for line in lines), err
    return lines


@pytest.fixture
def app(tmp_path, monkeypatch) -> str:
    """An app module like the quick start's (a fresh name: modules are cached)."""
    name = f"quickapp_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:jq"


def test_without_app_it_says_which_defaults_it_used(cli: Cli, queue: JobQueue):
    register(queue, "w-images", ["images"])  # the app's worker, serving only its queue
    code, out, err = cli("enqueue", "resize", "--args", ARGS)
    assert code == 0, err
    job = queue.get_job(int(out))
    assert out == f"{job.id}\n"  # scripts read the id alone
    assert (job.queue, job.priority, job.max_attempts) == ("default", 0, 20)
    defaults, unserved = _warnings(err)
    assert "without --app" in defaults and "'resize'" in defaults
    assert "queue 'default', priority 0 and max_attempts 20" in defaults
    assert "--app package.module:jq" in defaults and "--queue/--priority/--max-attempts" in defaults
    assert "no live worker serves queue 'default'" in unserved
    assert "live workers serve images" in unserved and f"job {job.id} waits" in unserved


def test_options_that_say_everything_leave_only_what_they_left_out(cli: Cli, queue: JobQueue):
    register(queue, "w-images", ["images"])
    code, _, err = cli("enqueue", "resize", "--args", ARGS, "--queue", "images")
    assert code == 0
    (defaults,) = _warnings(err)  # the queue is served: no second warning
    assert "priority 0 and max_attempts 20" in defaults and "queue 'default'" not in defaults
    assert "--priority/--max-attempts" in defaults
    given = ("--queue", "images", "--priority", "0", "--max-attempts", "5")
    code, _, err = cli("enqueue", "resize", "--args", ARGS, *given)
    assert code == 0 and err == ""


def test_with_app_the_tasks_settings_apply_and_nothing_is_said(cli: Cli, queue: JobQueue, app):
    register(queue, "w-images", ["images"])
    code, out, err = cli("enqueue", "resize", "--args", ARGS, "--app", app)
    assert code == 0 and err == "", err
    job = queue.get_job(int(out))
    assert (job.queue, job.max_attempts) == ("images", 5)


def test_with_app_a_queue_no_live_worker_serves_is_warned_about(cli: Cli, queue: JobQueue, app):
    code, out, err = cli("enqueue", "resize", "--args", ARGS, "--app", app)
    assert code == 0
    (unserved,) = _warnings(err)
    assert "no live worker serves queue 'images' (no live worker is registered)" in unserved
    assert queue.get_job(int(out)).status == JobStatus.AVAILABLE  # enqueued all the same
    # A worker of that queue that went silent (SIGKILLed) serves nothing.
    register(queue, "w-dead", ["images"])
    shift = "heartbeat_at - interval '10 minutes'" if is_pg(queue) else "heartbeat_at - 600"
    sql(queue, f"UPDATE jobkeeper_workers SET heartbeat_at = {shift}")
    register(queue, "w-other", ["emails", "reports"])
    code, _, err = cli("enqueue", "resize", "--args", ARGS, "--app", app, "--json")
    assert code == 0
    (unserved,) = _warnings(err)
    assert "no live worker serves queue 'images' (live workers serve emails, reports)" in unserved
