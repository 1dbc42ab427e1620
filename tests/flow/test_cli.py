"""``jobkeeper queues list|pause|resume|set``: agrees with the API; exit
codes 0 ok, 2 bad input (one line), 1 anything else; QueueFull exits 2."""

from __future__ import annotations

import dataclasses

import pytest

from jobkeeper import JobQueue, QueueInfo
from support.cli import Cli


@pytest.fixture
def cli(db_url, capsys) -> Cli:
    return Cli.migrated(db_url, capsys)


def test_cli_and_api_agree(cli):
    with JobQueue(cli.url) as jq:
        jq.enqueue("t", {}, queue="emails")
        assert cli("queues", "set", "emails", "--concurrency", "5", "--rate-limit", "100/m")[0] == 0
        assert cli("queues", "set", "emails", "--max-pending", "9")[0] == 0
        assert cli("queues", "pause", "reports")[0] == 0
        listed = cli.json("queues", "list")
        assert listed == [q.as_dict() for q in jq.queues()]
        assert [tuple(q) for q in listed] == [
            tuple(f.name for f in dataclasses.fields(QueueInfo))
        ] * 2
        emails = listed[0]
        assert (emails["name"], emails["concurrency"], emails["rate_limit"]) == (
            "emails",
            5,
            "100/m",
        )
        assert emails["max_pending"] == 9 and emails["counts"]["available"] == 1
        assert listed[1]["name"] == "reports" and listed[1]["paused"] is True
        assert cli("queues", "set", "emails", "--concurrency", "none")[0] == 0
        assert jq.queues()[0].concurrency is None and jq.queues()[0].rate_limit == "100/m"
        assert cli("queues", "resume", "reports")[0] == 0
        assert [q.name for q in jq.queues()] == ["emails"]
        code, out, _ = cli("queues", "list")
        assert code == 0 and "emails" in out and "100/m" in out


def test_resume_of_a_queue_that_is_not_paused_writes_nothing_and_says_so(cli):
    with JobQueue(cli.url) as jq:
        code, out, _ = cli("queues", "resume", "typo")
        assert (
            code == 0
            and "queue typo not paused (no setting, live job or recent job names it)" in out
        )
        jq.configure_queue("limited", concurrency=3)
        code, out, _ = cli("queues", "resume", "limited")
        assert code == 0 and "queue limited not paused (it was not paused)" in out
        assert [(q.name, q.paused, q.concurrency) for q in jq.queues()] == [("limited", False, 3)]
        code, out, _ = cli("queues", "pause", "later")
        assert code == 0 and "the pause holds for its jobs" in out
        code, out, _ = cli("queues", "resume", "later")
        assert code == 0 and out.strip() == "queue later resumed"
        assert [q.name for q in jq.queues()] == ["limited"]


@pytest.mark.parametrize(
    "args",
    [
        ("queues", "set", "q", "--concurrency", "0"),
        ("queues", "set", "q", "--concurrency", "x"),
        ("queues", "set", "q", "--rate-limit", "5/d"),
        ("queues", "set", "q", "--max-pending", "-3"),
        ("queues", "set", "q"),
        ("queues", "pause", "bad name"),
        ("queues", "resume", "bad name"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, args):
    code, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    with JobQueue(cli.url) as jq:
        assert jq.queues() == []


@pytest.mark.parametrize(
    ("option", "value", "bound"),
    [
        ("--max-pending", "99999999999999999999", "from 0 to 4611686018427387904, or 'none'"),
        ("--max-pending", "-3", "from 0 to 4611686018427387904, or 'none'"),
        ("--concurrency", "99999999999999999999", "from 1 to 2147483647"),
        ("--concurrency", "0", "from 1 to 2147483647 (pause the queue to stop it)"),
    ],
)
def test_a_count_out_of_range_names_the_range(cli, option, value, bound):
    # Found by break-tests: --max-pending 99999999999999999999 said only
    # "must be an int >= 0", which it is; --max-pending -1 then said
    # "(or None)", the API's word, where the command line takes 'none'.
    code, _, err = cli("queues", "set", "q", option, value)
    assert code == 2 and f"{option} '{value}'" in err and bound in err, err
    assert "None" not in err, err


def test_queue_full_exits_2_naming_the_queue(cli):
    assert cli("queues", "set", "q", "--max-pending", "1")[0] == 0
    assert cli("enqueue", "t", "--queue", "q")[0] == 0
    code, out, err = cli("enqueue", "t", "--queue", "q")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: queue 'q' is full: 1 pending job, max_pending=1; nothing was written"
    ]


def test_status_shows_each_workers_version(cli):
    from datetime import UTC, datetime

    import jobkeeper
    from jobkeeper.models import WorkerInfo

    with JobQueue(cli.url) as jq:
        now = datetime.now(UTC)
        jq.backend.worker_register(worker=WorkerInfo("w-1", "h", 1, ["q"], now, now))
    schema = jq.backend.schema_expected()
    recorded = f"{jobkeeper.__version__} (schema {schema})"
    status = cli.json("status")
    assert [(w["version"], w["schema_version"]) for w in status["workers"]] == [(recorded, schema)]
    code, out, _ = cli("status")
    assert code == 0 and f"(schema {schema})" in out
