"""``jobkeeper periodic list [--json]`` and ``periodic prune``: a periodic
that no running worker registers any more shows as stale and is pruned;
exit codes 0 ok, 2 bad input, 1 anything else.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from support.cli import Cli

from .helpers import app, fabricate, service

KEYS = {
    "name",
    "schedule",
    "timezone",
    "task",
    "queue",
    "priority",
    "max_attempts",
    "args",
    "catch_up",
    "last_tick_at",
    "next_tick_at",
    "seen_at",
    "stale",
    "overdue",
}


@pytest.fixture
def cli(db_url, capsys) -> Cli:
    return Cli.migrated(db_url, capsys)


def test_a_removed_periodic_shows_stale_and_is_pruned(cli):
    # Deploy 1 registers two periodics; deploy 2 drops "gone".
    v1 = app(cli.url, every=60, task="gone")
    v1.periodic("*/5 * * * *", timezone="Europe/Berlin", task="kept", args={"n": 1})
    service(v1).run_once()
    v2 = service(
        app(cli.url, cron="*/5 * * * *", timezone="Europe/Berlin", task="kept", args={"n": 1})
    )
    v2.run_once()
    assert [row["stale"] for row in cli.json("periodic", "list")] == [False, False]

    # Only deploy 2's workers run now: "gone" was last seen an hour ago, "kept"
    # just now; a window of ten minutes tells them apart however slow the run.
    now = v1.backend.db_now()
    fabricate(cli.url, "gone", seen_at=now - timedelta(hours=1))
    v2.run_once()
    listed = cli.json("periodic", "list", "--stale-after", "600")
    assert [(r["name"], r["stale"]) for r in listed] == [("gone", True), ("kept", False)]
    assert all(set(row) == KEYS for row in listed)
    kept = listed[1]
    assert (kept["schedule"], kept["timezone"], kept["task"], kept["args"]) == (
        "*/5 * * * *",
        "Europe/Berlin",
        "kept",
        {"n": 1},
    )
    assert kept["last_tick_at"] is None and kept["next_tick_at"].endswith("+00:00")

    code, out, _ = cli("periodic", "list", "--stale-after", "600")
    assert code == 0 and "gone" in out and "stale" in out and "Europe/Berlin" in out

    assert cli.json("periodic", "prune", "--stale-after", "600") == {"pruned": ["gone"]}
    assert [r["name"] for r in cli.json("periodic", "list")] == ["kept"]
    code, out, _ = cli("periodic", "prune")
    assert (code, out.strip()) == (0, "pruned 0 stale periodics")


def test_default_stale_after_is_rescue_after(cli):
    gone = app(cli.url, every=60, task="gone")
    service(gone).run_once()
    assert cli.json("periodic", "list")[0]["stale"] is False
    now = gone.backend.db_now()
    fabricate(cli.url, "gone", seen_at=now.replace(year=now.year - 1))
    assert cli.json("periodic", "list")[0]["stale"] is True
    code, out, _ = cli("periodic", "prune")
    assert (code, out.strip()) == (0, "pruned 1 stale periodic: gone")
    assert cli.json("periodic", "list") == []


@pytest.mark.parametrize("window", ["0", "14.9"])
def test_prune_refuses_a_window_shorter_than_a_live_workers_refresh(cli, window):
    # Found by a break-test: --stale-after 0 pruned the periodic of a running
    # worker (seen a second before), which then lost a tick.
    live = app(cli.url, every=60, task="live")
    service(live).run_once()
    code, _, err = cli("periodic", "prune", "--stale-after", window)
    assert code == 2 and "below 15 seconds" in err and len(err.strip().splitlines()) == 1, err
    assert [r["name"] for r in cli.json("periodic", "list")] == ["live"]
    assert cli.json("periodic", "prune", "--stale-after", "15") == {"pruned": []}


@pytest.mark.parametrize("command", ["list", "prune"])
def test_a_window_longer_than_100_years_is_refused_by_name(cli, command):
    # Found by a break-test: 1e12 s failed on PostgreSQL only, as "timestamp
    # out of range" (exit 1), once a periodic row existed.
    live = app(cli.url, every=60, task="live")
    service(live).run_once()
    code, _, err = cli("periodic", command, "--stale-after", "1e12")
    assert code == 2 and "--stale-after=1000000000000.0 is longer than 100 years" in err, err
    assert [r["name"] for r in cli.json("periodic", "list")] == ["live"]
    # 100 years itself is a window like any other.
    listed = cli.json("periodic", "list", "--stale-after", str(100 * 365.25 * 86400))
    assert [(r["name"], r["stale"]) for r in listed] == [("live", False)]


def test_a_live_periodic_whose_next_tick_passed_unfired_shows_overdue(cli):
    # Left over from an earlier break-test (found on the dashboard): a periodic
    # whose worker had stopped less than --stale-after ago listed a next tick
    # in the past as "live".
    fleet = app(cli.url, every=60, task="stopped")
    fleet.periodic(every=3600, task="live")
    service(fleet).run_once()
    now = fleet.backend.db_now()
    fabricate(cli.url, "stopped", seen_at=now, next_tick_at=now - timedelta(minutes=1))
    code, out, _ = cli("periodic", "list", "--stale-after", "600")
    assert code == 0
    states = {line.split()[1]: line.split()[-2] for line in out.splitlines() if "every " in line}
    assert states == {"stopped": "overdue", "live": "live"}, out
    # Machines read the same from --json: stale is false, overdue true (it
    # had no overdue key: helper-82).
    assert [(r["name"], r["stale"], r["overdue"]) for r in cli.json("periodic", "list")] == [
        ("live", False, False),
        ("stopped", False, True),
    ]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["periodic", "list", "--stale-after", "-1"], 2, "--stale-after must"),
        (["periodic", "prune", "--stale-after", "nan"], 2, "--stale-after"),
        (["periodic", "list", "--stale-after", "soon"], 2, "soon"),
        (["periodic", "bogus"], 2, "bogus"),
        (["periodic", "list", "--colour"], 2, "--colour"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, args, code, needle):
    got, _, err = cli(*args)
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def test_an_unmigrated_database_exits_1(tmp_path, capsys):
    runner = Cli(f"sqlite:///{tmp_path / 'none.db'}", capsys)
    code, _, err = runner("periodic", "list")
    assert code == 1 and "migrate" in err
