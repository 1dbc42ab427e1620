"""How the CLI reads what is typed: numbers, seconds, markup, URLs and
paths, as found by a breaking run of the Click port.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from backends.helpers import total_rows
from jobkeeper import JobQueue, JobStatus
from support.cli import Cli

from .helpers import STATUSES, assert_one_line_error

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
