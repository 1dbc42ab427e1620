"""The ``jobkeeper`` command on both backends: what it prints and its ``--json``
shapes. Exit codes are in test_exit_codes.py, ``--app`` in test_apps.py.

Most cases call ``jobkeeper.cli.main.main`` in-process (fast); a few run the
real entry point, ``python -m jobkeeper``, in subprocesses.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from backends.helpers import claim, complete, fail, kill
from jobkeeper import JobStatus
from jobkeeper.cli.main import main
from support.db import count, sql

from .helpers import JOB_KEYS, LATEST, STATUSES, assert_one_line_error

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
        "schema_version",
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


#: Fields ``jobs show`` leaves to ``--json``: shown in rows of their own
#: (args, result, errors) or internal (the fence of a lone attempt).
NOT_IN_THE_TABLE = {"args", "args_error", "result", "errors", "alone_fence"}


def test_jobs_show_prints_every_field_that_is_set(cli, queue):
    # Found by a break-test: a job waiting on its serial key showed no key.
    job = queue.enqueue("t", {}, serial_key="user:42", unique_key="u-1")
    sql(queue, "UPDATE jobkeeper_jobs SET run_alone = ?, crashes = 1 WHERE id = ?", [True, job.id])
    shown = cli.json("jobs", "show", str(job.id))
    human = " ".join(cli.ok("jobs", "show", str(job.id)).replace("│", " ").split())
    set_fields = {k for k, v in shown.items() if v is not None and v is not False}
    for key in sorted(set_fields - NOT_IN_THE_TABLE - {"waiting"}):
        assert f" {key} " in human, key
    assert "serial_key user:42" in human and "run_alone True" in human and "crashes 1" in human


def test_jobs_show_dead_and_completed(cli, queue):
    dead = kill(queue, queue.enqueue("t", {}, queue="d"))
    done = queue.enqueue("t", {}, queue="c")
    (running,) = claim(queue, "c")
    complete(queue, running, '{"answer":42}')
    human = " ".join(cli.ok("jobs", "show", str(dead.id)).replace("│", " ").split())
    # A dead letter keeps its fence (schema 18): its one claim.
    assert " fence 1 " in human, human
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
