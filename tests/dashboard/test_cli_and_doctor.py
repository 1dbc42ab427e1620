"""`jobkeeper dashboard`'s loopback rule, `jobkeeper doctor` and `dead purge`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import sys
import time

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.cli.main import main
from jobkeeper.dashboard.app import PASSWORD_ENV, is_loopback
from jobkeeper.doctor import Check, exit_code, run_checks
from support.db import migrate_to

from .seed import seed


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "example.com"])
def test_dashboard_refuses_non_loopback_without_password(jq, capsys, monkeypatch, served, host):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    code, _, err = run(capsys, "--database", jq.url.url, "dashboard", "--host", host)
    assert code == 2
    assert err.count("\n") == 1 and PASSWORD_ENV in err and host in err
    assert served == []


def test_dashboard_serves_loopback_and_password_protected_hosts(jq, capsys, monkeypatch, served):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    code, out, _ = run(capsys, "--database", jq.url.url, "dashboard", "--port", "0", "--read-only")
    assert code == 0 and "read-only" in out
    # --port 0: a free port, and the URL printed is that one (break-test 14
    # found "http://127.0.0.1:0/" printed while uvicorn listened elsewhere).
    port = served[-1]["port"]
    assert served[-1]["host"] == "127.0.0.1" and port > 0
    assert f"http://127.0.0.1:{port}/" in out
    assert served[-1]["app"].state.dashboard.read_only is True
    monkeypatch.setenv(PASSWORD_ENV, "pw")
    code, _, _ = run(capsys, "--database", jq.url.url, "dashboard", "--host", "0.0.0.0")
    assert code == 0 and served[-1]["host"] == "0.0.0.0"


def test_is_loopback():
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "host.example"]))


def test_doctor_on_a_healthy_database(jq, capsys):
    seed(jq)
    checks = run_checks(jq)
    names = [check.name for check in checks]
    assert names[:4] == ["database", "schema", "writes", "claim plan"]
    assert not [c for c in checks if c.level == "fail"], checks
    if jq.backend.name == "sqlite":
        assert {"journal mode", "wal size", "busy timeout"} <= set(names)
        assert all(c.level == "ok" for c in checks), checks
    else:
        assert {"dead tuples", "autovacuum", "indexes", "xmin horizon", "notify queue"} <= set(
            names
        )
    code, out, _ = run(capsys, "--database", jq.url.url, "doctor")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == len(checks)
    assert all(line.split()[0] in ("ok", "warn") for line in lines)
    code, out, _ = run(capsys, "--database", jq.url.url, "doctor", "--json")
    assert code == 0
    data = json.loads(out)
    assert [d["check"] for d in data] == names
    assert set(data[0]) == {"check", "level", "message"}


def test_doctor_fails_on_an_unmigrated_database(db_url, capsys):
    path = None
    if db_url.startswith("sqlite"):
        # A file that exists but holds no schema (doctor must not create one).
        import sqlite3

        path = db_url.removeprefix("sqlite:///")
        sqlite3.connect(path).close()
    code, out, _ = run(capsys, "--database", db_url, "doctor")
    assert code == 1
    text = " ".join(out.split())
    if path is None:
        assert "fail schema" in text
    else:  # an empty file is refused as it is, before anything opens it
        assert "fail database cannot use" in text and "is empty (0 bytes)" in text
        assert os.path.getsize(path) == 0
    assert "jobkeeper migrate" in text or "`jobkeeper --database" in text
    checks = run_checks(JobQueue(db_url))
    assert exit_code(checks) == 1


def test_doctor_on_a_sqlite_file_that_does_not_exist_says_so(capsys, tmp_path):
    # Break-test 4: "ok database sqlite at ... answers" for a file (and a
    # directory) that did not exist; nothing answered.
    for path, directory_said in (
        (tmp_path / "x.db", False),
        (tmp_path / "nodir" / "x.db", True),
    ):
        code, out, _ = run(capsys, "--database", f"sqlite:///{path}", "doctor")
        text = " ".join(out.split())
        assert code == 1 and text.startswith("fail database"), text
        assert (
            "the file does not exist" in text
            and "migrate` (or JobQueue.migrate()) to create it" in text
        )
        assert ("its directory" in text) is directory_said, text
        assert not path.exists() and not (tmp_path / "nodir").exists()


def test_doctor_fails_when_the_database_is_unreachable(capsys, tmp_path):
    url = "postgresql://nobody@127.0.0.1:1/nothing"
    code, out, _ = run(capsys, "--database", url, "doctor")
    assert code == 1 and out.split()[0] == "fail"


def test_doctor_warns_about_a_long_open_transaction(pg_url):
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        with psycopg.connect(pg_url) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            # The holder's last query starts with comments, as jobkeeper's
            # own and many an ORM's do: doctor quoted the comment, not the
            # statement (migrate already dropped them).
            conn.execute(
                "-- an app's header line\n/* and a block\n comment */ "
                "SELECT count(*) FROM jobkeeper_jobs"
            ).fetchone()
            time.sleep(1.2)
            checks = {c.name: c for c in run_checks(jq, xmin_warn_after=1.0)}
            horizon = checks["xmin horizon"]
            assert horizon.level == "warn", horizon
            assert "hold back vacuum" in horizon.message
            assert "pg_terminate_backend" in horizon.message
            assert "'SELECT count(*) FROM jobkeeper_jobs'" in horizon.message, horizon.message
            conn.rollback()
    finally:
        jq.close()


def test_doctor_warns_about_stale_workers(jq):
    seeded = seed(jq)
    del seeded
    if jq.backend.name == "sqlite":
        jq.backend._conn().execute("UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - 600")
    else:
        jq.backend._fetch_raw(
            "UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - interval '10 minutes'"
        )
    workers = {c.name: c for c in run_checks(jq)}["workers"]
    assert workers.level == "warn" and "silent past their rescue window" in workers.message


def test_doctor_warns_about_settings_that_barely_work(db_url):
    jq = JobQueue(db_url, heartbeat_interval=5, rescue_after=16)
    jq.migrate()
    try:
        settings = {c.name: c for c in run_checks(jq)}["settings"]
        assert settings.level == "warn" and "heartbeats" in settings.message
    finally:
        jq.close()


def test_doctor_checks_the_settings_of_the_app_it_is_given(db_url, capsys, tmp_path, monkeypatch):
    # Without --app, doctor judged a JobQueue of jobkeeper's defaults and said
    # "ok" whatever the workers ran with. With it, the app's own settings are
    # judged; without it, the line says whose settings those were.
    (tmp_path / "doctorapp.py").write_text(
        "from jobkeeper import JobQueue\njq = JobQueue(heartbeat_interval=5, rescue_after=16)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    setup = JobQueue(db_url)
    setup.migrate()
    setup.close()
    code, out, _ = run(capsys, "--database", db_url, "doctor", "--json")
    checks = {d["check"]: d for d in json.loads(out)}
    settings = checks["settings"]
    assert code == 0 and settings["level"] == "ok"
    assert "jobkeeper's defaults" in settings["message"] and "--app" in settings["message"]
    if db_url.startswith("sqlite"):  # the busy timeout is a setting too
        assert "jobkeeper's defaults" in checks["busy timeout"]["message"]
    code, out, _ = run(capsys, "--database", db_url, "doctor", "--app", "doctorapp:jq", "--json")
    settings = {d["check"]: d for d in json.loads(out)}["settings"]
    assert settings["level"] == "warn" and "rescue_after=16 s" in settings["message"]
    code, _, err = run(capsys, "--database", db_url, "doctor", "--app", "nowhere:jq")
    assert code == 2 and "nowhere" in err


def test_dead_purge(jq, capsys):
    seeded = seed(jq)
    url = jq.url.url
    for bad in ([], ["--all", str(seeded.dead)], ["--all", "--older-than", "5"]):
        code, _, err = run(capsys, "--database", url, "dead", "purge", *bad)
        assert code == 2 and err.count("\n") == 1
    code, out, _ = run(capsys, "--database", url, "dead", "purge", "--older-than", "3600", "-y")
    assert code == 0 and "deleted 0 dead letters" in out
    code, _, err = run(capsys, "--database", url, "dead", "purge", str(seeded.running))
    assert code == 1 and f"not dead letters: {seeded.running}" in err
    code, out, _ = run(capsys, "--database", url, "dead", "purge", str(seeded.dead))
    assert code == 0 and "deleted 1 dead letter" in out
    assert jq.get_job(seeded.dead) is None
    assert jq.get_job(seeded.running) is not None


def test_purge_dead_api(jq):
    seeded = seed(jq)
    assert jq.purge_dead(older_than=60) == []
    assert jq.purge_dead([seeded.running]) == []
    assert jq.purge_dead(older_than=0) == [seeded.dead]
    assert jq.purge_dead() == []
    from jobkeeper.errors import ConfigError

    with pytest.raises(ConfigError):
        jq.purge_dead(older_than=-1)
    with pytest.raises(ConfigError):
        jq.purge_dead([0])


def test_list_jobs_task_and_before(jq):
    seeded = seed(jq)
    reports = jq.list_jobs(task="render_report")
    assert [j.id for j in reports] == [seeded.scheduled, seeded.dead]
    page = jq.list_jobs(limit=3, before=seeded.completed[5])
    assert [j.id for j in page] == [seeded.completed[4], seeded.completed[3], seeded.completed[2]]
    assert jq.list_jobs("dead", before=seeded.dead) == []
    # Positional callers keep working.
    assert [j.id for j in jq.list_jobs("available", "emails", 2)] == seeded.available[:0:-1]


def test_throughput_and_oldest_due(jq):
    seeded = seed(jq)
    series = jq.throughput()
    assert len(series) == 60
    assert sum(c.get("completed", 0) for _, c in series) == 12
    assert sum(c.get("cancelled", 0) for _, c in series) == 1
    assert series[-1][0] <= jq.backend.db_now()
    oldest = jq.oldest_due()
    assert oldest["emails"][0] == seeded.available[0] and oldest["emails"][1] >= 0
    assert "reports" not in oldest


def test_dashboard_refuses_a_schema_it_cannot_read(db_url, capsys, served, monkeypatch):
    # Found by a break-test: on an unmigrated PostgreSQL database it served,
    # and answered every page (/metrics too) with a 500.
    if db_url.startswith("sqlite"):
        # A database file, without jobkeeper's tables (a missing or empty
        # file is refused before, by the connection).
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as conn:
            conn.execute("CREATE TABLE unrelated (x)")
    code, out, err = run(capsys, "--database", db_url, "dashboard", "--port", "0")
    assert code == 1 and "is not migrated: run `jobkeeper --database" in err, err
    with JobQueue(db_url) as jq:
        want = jq.backend.schema_expected()
        migrate_to(jq, want - 1, monkeypatch)
    code, out, err = run(capsys, "--database", db_url, "dashboard", "--port", "0")
    assert code == 1, err
    assert f"at schema version {want - 1}, behind this jobkeeper's {want}" in err
    assert served == [] and "dashboard on" not in out
    with JobQueue(db_url) as jq:
        jq.migrate()
    code, out, _ = run(capsys, "--database", db_url, "dashboard", "--port", "0")
    assert code == 0 and "dashboard on" in out and len(served) == 1


def test_dashboard_names_an_ipv6_address_in_brackets(jq, capsys, served):
    # Found by a break-test: --host ::1 printed http://::1:8794/.
    code, out, _ = run(capsys, "--database", jq.url.url, "dashboard", "--host", "::1")
    assert code == 0 and "jobkeeper dashboard on http://[::1]:" in out, out


def test_dashboard_on_a_port_in_use_fails_in_one_line(jq, capsys, monkeypatch, served):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        code, out, err = run(capsys, "--database", jq.url.url, "dashboard", "--port", port)
    assert code == 1
    assert err.count("\n") == 1 and f"--port {port}" in err and "cannot listen" in err
    assert "dashboard on" not in out
    assert served == []


def test_dashboard_without_its_extra_says_which_package_is_missing(jq, capsys, monkeypatch):
    # A base install: the dashboard's own modules import jinja2, which is absent.
    for name in [m for m in sys.modules if m.startswith("jobkeeper.dashboard")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "jinja2", None)
    code, _, err = run(capsys, "--database", jq.url.url, "dashboard")
    assert code == 2
    assert err.count("\n") == 1 and "jinja2" in err and "jobkeeper[dashboard]" in err


def test_doctor_app_fails_on_what_a_worker_would_refuse_of_its_periodics(jq):
    # Found by a break-test: doctor --app said nothing of a periodic naming
    # an unknown task, and the worker then refused to start.
    @jq.task
    def cleanup() -> None: ...

    jq.periodic(every=60, task="cleanup")
    (check,) = [c for c in run_checks(jq) if c.name == "periodics"]
    assert check.level == "ok" and "1 registered" in check.message
    jq.periodic(every=60, task="clenaup")
    (check,) = [c for c in run_checks(jq) if c.name == "periodics"]
    assert check.level == "fail" and "'clenaup'" in check.message and "cleanup" in check.message
    assert exit_code(run_checks(jq)) == 1


@pytest.mark.parametrize("port", ["\uff18\uff10", "+80", "8_0", " 80", "65536"])
def test_dashboard_port_takes_ascii_digits_only(jq, capsys, served, port):
    # Found by a break-test: --port took fullwidth and '+1', '1_0' (int()).
    code, _, err = run(capsys, "--database", jq.url.url, "dashboard", "--port", port)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert served == []


@pytest.mark.parametrize(
    ("server", "table", "says"),
    [
        (False, True, "autovacuum is off on this server (autovacuum = off)"),
        (True, False, "autovacuum is off for jobkeeper_jobs (its autovacuum_enabled = false)"),
    ],
)
def test_doctor_says_where_autovacuum_is_off(server, table, says):
    # Break-test: a server-wide autovacuum = off was reported as off "for
    # jobkeeper_jobs", whose own setting was on.
    from jobkeeper.doctor import _postgres

    facts = {"table": {"live": 10, "dead": 0, "autovacuum": server, "table_autovacuum": table}}
    (check,) = [c for c in _postgres(facts, 60.0) if c.name == "autovacuum"]
    assert check.level == "warn"
    assert check.message.startswith(says), check.message


def test_doctor_reads_the_tables_autovacuum_switch_as_postgresql_does(pg_url):
    # Break-test: autovacuum_enabled=off (or 0, no) was reported "on": the
    # check compared the stored text with 'autovacuum_enabled=false'. (The
    # fact is checked, not the verdict: a server with autovacuum = off, as
    # the test server may be, gives its own warning first.)
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for spelling, enabled in (("off", False), ("0", False), ("no", False),
                                      ("false", False), ("on", True), ("1", True)):  # fmt: skip
                conn.execute(f"ALTER TABLE jobkeeper_jobs SET (autovacuum_enabled={spelling})")
                table = jq.backend.database_health()["table"]
                assert table["table_autovacuum"] is enabled, spelling
            conn.execute("ALTER TABLE jobkeeper_jobs RESET (autovacuum_enabled)")
            assert jq.backend.database_health()["table"]["table_autovacuum"] is True
    finally:
        jq.close()


def test_doctor_names_invalid_and_retired_indexes_of_the_jobs_table(pg_url):
    # Break-test 19: an index left by an interrupted DROP INDEX CONCURRENTLY
    # (invalid, still written by every enqueue) went unmentioned.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:

        def indexes() -> Check:
            return {c.name: c for c in run_checks(jq)}["indexes"]

        assert indexes().level == "ok"
        jq.enqueue("t", {})
        jq.enqueue("t", {})
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # A concurrent unique build over duplicates fails and leaves the
            # index behind, invalid.
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute("CREATE UNIQUE INDEX CONCURRENTLY jk_bad ON jobkeeper_jobs (queue)")
            conn.execute(
                "CREATE INDEX jobkeeper_jobs_serial_first_idx ON jobkeeper_jobs (serial_key)"
            )
        check = indexes()
        assert check.level == "warn"
        assert check.message.startswith("jk_bad (invalid), jobkeeper_jobs_serial_first_idx on ")
        jq.migrate()  # drops the retired one
        assert indexes().message.startswith("jk_bad (invalid) on jobkeeper_jobs")
    finally:
        jq.close()
