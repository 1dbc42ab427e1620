"""``jobkeeper verify`` end to end on both backends: a short run against a
fresh database passes (exit 0) and leaves no row, worker or file behind, with
the user's own jobs untouched; a run whose history is broken before the check
fails (exit 1); bad input exits 2 with one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from jobkeeper import JobQueue
from jobkeeper.cli import verify as verify_cli
from jobkeeper.cli.main import main
from jobkeeper.verify import history as verify_history
from jobkeeper.verify import run as verify_run
from support.waiting import wait_for

#: Long enough for every fault kind at least once (one each ~3 s).
MINUTES = "0.35"


def run_cli(*args: str, tmp: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m jobkeeper ARGS`` with ``TMPDIR`` at ``tmp`` (made if missing)."""
    tmp.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "jobkeeper", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TMPDIR": str(tmp), "COLUMNS": "200"},
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def snapshot(jq: JobQueue) -> dict[str, Any]:
    """Everything of the user's a run could touch."""
    jobs = jq.list_jobs(limit=10_000)
    return {
        "jobs": sorted((j.id, j.queue, j.status.value, j.attempt, str(j.result)) for j in jobs),
        "queues": sorted((q.name, q.paused, q.concurrency) for q in jq.queues()),
        "periodic": sorted(p.name for p in jq.periodic_list()),
        "workers": sorted(w.id for w in jq.workers()),
        "stats": jq.stats(),
    }


@pytest.fixture
def user_db(db_url: str):
    """A migrated database holding the user's own jobs: pending, scheduled,
    completed and dead, a queue setting and a periodic row.
    """
    jq = JobQueue(db_url)
    jq.migrate()
    jq.enqueue("user.send", {"to": "a"}, queue="emails", external=True)
    jq.enqueue("user.send", {"to": "b"}, queue="emails", delay=3600, external=True)
    jq.configure_queue("emails", concurrency=2)
    jq.periodic("0 * * * *", task="user.report", queue="reports")
    jq.backend.periodic_upsert(periodics=list(jq.periodics.values()))
    yield jq
    jq.close()


def test_a_short_run_passes_and_leaves_nothing_behind(user_db: JobQueue, tmp_path: Path):
    before = snapshot(user_db)
    assert before["jobs"] and before["periodic"] and before["queues"]
    tmp = tmp_path / "tmp"
    done = run_cli("--database", user_db.url.url, "verify", "--minutes", MINUTES, tmp=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
    for figure in ("jobs", "faults", "rescues", "overlaps", "lost"):
        assert figure in done.stdout
    for fault in ("SIGKILL", "SIGSTOP", "graceful"):
        assert fault in done.stdout, done.stdout
    # The user's jobs, settings and periodic rows are as they were, and the
    # run's queue, dead letters, workers and temp files are gone.
    assert snapshot(user_db) == before
    assert not user_db.list_jobs(status="dead", limit=10_000)
    assert not [q for q in user_db.stats() if q.startswith("jkverify_")]
    assert list(tmp.iterdir()) == []


def test_a_broken_history_fails_with_exit_1(
    user_db: JobQueue,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    def lose_a_job_and_overlap_another(history: verify_history.History) -> None:
        done = [row for row in history.rows if row.status == "completed"]
        history.rows.remove(done[0])
        # A second execution of a finished job, started while its only
        # holder (never stopped) still ran it: two live holders.
        runs: dict[tuple[int, int, str], list[verify_history.Event]] = {}
        for event in history.events:
            runs.setdefault((event.job, event.attempt, event.worker), []).append(event)
        # A holder verify never stopped or killed: a long run is often one
        # a SIGSTOP stretched, and an overlap with a stopped holder is allowed.
        untouched = {life.pid for life in history.lives if not life.pauses and not life.killed}
        job, attempt, worker, start, end = next(
            (*key, *sorted(e.t for e in events))
            for key, events in runs.items()
            if len(events) == 2
            and abs(events[1].t - events[0].t) > 0.2
            and verify_history.pid_of(key[2]) in untouched
        )
        middle = (start + end) / 2
        history.events += [
            # (An attempt number no real execution of the run has.)
            verify_history.Event("S", job, attempt + 100, worker, middle),
            verify_history.Event("E", job, attempt + 100, worker, end + 0.5, "error"),
        ]

    original = verify_run.run_verify

    def tampered(config: verify_run.VerifyConfig, **kwargs: Any) -> verify_run.Verdict:
        return original(config, **kwargs, tamper=lose_a_job_and_overlap_another)

    monkeypatch.setattr(verify_cli.verify_run, "run_verify", tampered)
    (tmp_path / "tmp").mkdir()
    # tempfile caches its directory: set it, not only $TMPDIR.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit_info:
        main(["--database", user_db.url.url, "verify", "--minutes", "0.15"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 1, out
    assert "FAIL" in out
    assert "[lost]" in out and "[overlap]" in out
    assert not [q for q in user_db.stats() if q.startswith("jkverify_")]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_unmigrated_database_exits_2_with_one_line(db_url: str, tmp_path: Path):
    done = run_cli("--database", db_url, "verify", "--minutes", "0.1", tmp=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "run `jobkeeper --database " in lines[0] and " migrate`" in lines[0]
    if db_url.startswith("sqlite"):
        assert not Path(db_url.split("///", 1)[1]).exists()  # nothing created


def test_an_unreachable_database_exits_2_with_one_line(tmp_path: Path):
    url = "postgresql://postgres@127.0.0.1:9/nowhere?connect_timeout=2"
    done = run_cli("--database", url, "verify", tmp=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unavailable" in lines[0], done.stderr


@pytest.mark.parametrize("minutes", ["0", "-1", "abc"])
def test_bad_minutes_exit_2_with_one_line(user_db: JobQueue, tmp_path: Path, minutes: str):
    done = run_cli("--database", user_db.url.url, "verify", "--minutes", minutes, tmp=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_its_workers_and_cleans_up(
    user_db: JobQueue, tmp_path: Path, signum: int
):
    # SIGTERM (what systemd, CI and `timeout` send) found by a break-test:
    # verify died at once, leaving its workers behind, one SIGSTOPped for good.
    before = snapshot(user_db)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # Started as from a terminal, where Ctrl-C interrupts: a suite run in the
    # background (nohup, `cmd &` without job control) ignores SIGINT, and a
    # child inherits that, so Python would install no KeyboardInterrupt.
    inherited = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobkeeper", "--database", user_db.url.url, "verify"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
    finally:
        signal.signal(signal.SIGINT, inherited)
    try:

        def running_jobs() -> list[int]:
            ours = [w for w in user_db.workers() if w.queues[0].startswith("jkverify_")]
            queues = {w.queues[0] for w in ours}
            done = sum(user_db.stats().get(q, {}).get("completed", 0) for q in queues)
            return [w.pid for w in ours] if len(ours) >= 3 and done else []

        pids = wait_for(running_jobs, timeout=120, what="verify's workers at work", every=0.2)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    left = [pid for pid in pids if alive(pid)]
    for pid in left:  # a failing run must not leave them to the next tests
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    assert not left
    assert snapshot(user_db) == before
    assert list(tmp.iterdir()) == []
