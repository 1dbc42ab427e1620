"""Which database a command uses, and a command that leaves a set
``$JOBKEEPER_DATABASE_URL`` unused saying so (newcomer break-test: with
``jq = JobQueue("sqlite:///appdb.db")`` and the variable naming other.db,
``enqueue --app`` wrote job 3 to appdb.db and ``jobs show 3`` found nothing
in other.db, with not a word about either).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobkeeper import JobQueue, JobStatus
from jobkeeper.cli.main import main

APP = """
from jobkeeper import JobQueue

jq = JobQueue({url})


@jq.task(queue="chain")
def first() -> int:
    return 1
"""

SECRET = "sekrit"


def _urls(db_url: str, tmp_path: Path) -> tuple[str, str]:
    """(the app's own URL, another URL for the variable): each backend's
    test database on one side, a password on a URL of either side.
    """
    if db_url.startswith("postgresql"):
        return db_url.replace("postgres@", f"postgres:{SECRET}@", 1), f"sqlite:///{tmp_path}/o.db"
    return db_url, f"postgresql://someone:{SECRET}@127.0.0.1:1/other"


def _run(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), **env},
    )


def test_a_command_with_app_says_the_variable_is_unused(db_url: str, tmp_path: Path):
    app_url, other_url = _urls(db_url, tmp_path)
    (tmp_path / "ovapp.py").write_text(APP.format(url=repr(app_url)))
    with JobQueue(app_url) as jq:
        jq.migrate()
    env = {"JOBKEEPER_DATABASE_URL": other_url}
    app_shown, other_shown = (url.replace(f":{SECRET}@", ":***@") for url in (app_url, other_url))
    said = f"$JOBKEEPER_DATABASE_URL ({other_shown}) is not used: --app ovapp:jq's JobQueue"

    enqueued = _run(tmp_path, "enqueue", "first", "--app", "ovapp:jq", "--json", env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    assert f"warning: {said}" in enqueued.stderr and app_shown in enqueued.stderr
    assert "commands without --app" in enqueued.stderr and "--database URL" in enqueued.stderr
    doctor = _run(tmp_path, "doctor", "--app", "ovapp:jq", env=env)
    assert doctor.returncode == 0, doctor.stderr
    assert f"warning: {said}" in doctor.stderr
    worker = _run(
        tmp_path, "worker", "--app", "ovapp:jq", "--burst", "--log-level", "WARNING", env=env
    )
    assert worker.returncode == 0, worker.stderr
    assert f"WARNING jobkeeper.worker: {said}" in worker.stderr
    for result in (enqueued, doctor, worker):
        assert SECRET not in result.stderr + result.stdout
    # The precedence itself is unchanged: the app's own database was used.
    with JobQueue(app_url) as jq:
        jobs = jq.list_jobs(queue="chain")
        assert [j.status for j in jobs] == [JobStatus.COMPLETED]


def test_nothing_is_said_when_the_variable_is_used_or_database_is_given(
    db_url: str, tmp_path: Path
):
    with JobQueue(db_url) as jq:
        jq.migrate()
    (tmp_path / "envapp.py").write_text(APP.format(url=""))
    agreed = _run(
        tmp_path, "enqueue", "first", "--app", "envapp:jq", env={"JOBKEEPER_DATABASE_URL": db_url}
    )
    assert agreed.returncode == 0, agreed.stderr
    assert "is not used" not in agreed.stderr
    (tmp_path / "ownapp.py").write_text(APP.format(url=repr(f"sqlite:///{tmp_path}/own.db")))
    other = {"JOBKEEPER_DATABASE_URL": f"sqlite:///{tmp_path}/o.db"}
    chosen = _run(
        tmp_path, "--database", db_url, "enqueue", "first", "--app", "ownapp:jq", env=other
    )
    assert chosen.returncode == 0, chosen.stderr
    assert "is not used" not in chosen.stderr
    with JobQueue(db_url) as jq:
        assert len(jq.list_jobs(queue="chain")) == 2


def test_demo_says_it_leaves_the_variable_unused(capsys, monkeypatch):
    import jobkeeper.demo.runner as runner

    seen: list[str | None] = []

    def run_demo(console: object, *, database_url: str | None, **options: object) -> int:
        seen.append(database_url)
        return 0

    monkeypatch.setattr(runner, "run_demo", run_demo)
    monkeypatch.setenv("JOBKEEPER_DATABASE_URL", f"postgresql://u:{SECRET}@h/db")
    with pytest.raises(SystemExit) as info:
        main(["demo"])
    err = capsys.readouterr().err
    assert info.value.code == 0 and seen == [None]
    assert "warning: $JOBKEEPER_DATABASE_URL (postgresql://u:***@h/db) is not used" in err
    assert "jobkeeper-demo.db" in err and SECRET not in err


def test_the_help_states_the_rule(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "wins over everything" in text
    assert "for a command given --app, the URL of the app's JobQueue" in text
    assert "for the others $JOBKEEPER_DATABASE_URL" in text
