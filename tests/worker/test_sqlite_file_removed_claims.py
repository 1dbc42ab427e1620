"""A worker whose claim, not its heartbeat, is the first to find its SQLite
file removed: it stops with the error as well (the heartbeat case, with
worker subprocesses, is in ``tests/e2e/test_sqlite_file_removed.py``).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from jobkeeper import DatabaseError, JobQueue
from support.waiting import wait_for


def test_a_claim_on_a_removed_file_stops_the_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    # Beats 20 s apart: the claims find the removal first.
    jq = JobQueue(f"sqlite:///{directory / 'jobs.db'}", heartbeat_interval=20, rescue_after=120)
    jq.migrate()
    started: list[int] = []

    @jq.task
    def slow(i: int) -> None:
        started.append(i)
        time.sleep(0.3)

    jq.enqueue_many([("slow", {"i": i}) for i in range(20)])
    raised: list[BaseException] = []

    def run() -> None:
        try:
            jq.run_worker(concurrency=1, prefetch=0)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: started, what="a job started")
    shutil.rmtree(directory)
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], DatabaseError), raised
    assert "was removed while this process had it open" in str(raised[0])
    # The same ERROR line as when the heartbeat finds it.
    assert any("stopping now" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert len(started) <= 2  # the one running at the removal, and at most one claimed then
    with pytest.raises(DatabaseError):
        jq.enqueue("slow", {"i": 99})
    jq.close()
