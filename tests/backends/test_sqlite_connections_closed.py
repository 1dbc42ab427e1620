"""SQLite connections are closed when nothing can use them any more: a
thread's when the thread ends, the rest at ``close()`` (or when the queue is
collected), so nothing is left for Python 3.13's "ResourceWarning: unclosed
database" (``-X dev``), which ``jobkeeper demo`` printed at its end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from jobkeeper import JobQueue
from support.pythons import python_with_jobkeeper


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_threads_connection_is_closed_when_the_thread_ends(sqlite_url):
    # Each thread that used the queue left its connection open until
    # close(): two descriptors (the file and its WAL) per thread, so a pool
    # of threads that come and go (a web server's, the worker's runners)
    # piled them up.
    with JobQueue(sqlite_url, external_tasks=True) as jq:
        jq.migrate()
        jq.enqueue("t", {})  # this thread's connection
        before = open_fds()
        for _ in range(30):
            thread = threading.Thread(target=jq.enqueue, args=("t", {}))
            thread.start()
            thread.join()
        assert open_fds() - before <= 2
        assert len(jq.backend._threads) == 1  # type: ignore[attr-defined]
        assert len(jq.list_jobs(limit=100)) == 31


SCRIPT = textwrap.dedent(
    """
    import sys
    import threading

    from jobkeeper import JobQueue

    jq = JobQueue(sys.argv[1], external_tasks=True)
    jq.migrate()
    for _ in range(5):
        thread = threading.Thread(target=jq.enqueue, args=("t", {}))
        thread.start()
        thread.join()
    print(len(jq.list_jobs(limit=10)))
    if sys.argv[2] == "close":
        jq.close()
    """
)

DEMO = textwrap.dedent(
    """
    import sys

    from rich.console import Console

    from jobkeeper.demo import runner

    files = runner.stdlib_files()[:40]
    runner.stdlib_files = lambda: files
    sys.exit(runner.run_demo(Console(), database_url=sys.argv[1], workers=2, concurrency=2))
    """
)


def interpreter(python: str) -> str:
    return sys.executable if python == "current" else str(python_with_jobkeeper(python))


def run_dev(python: str, code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [interpreter(python), "-X", "dev", "-W", "error::ResourceWarning", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.parametrize("python", ["current", "3.13"])
@pytest.mark.parametrize("ending", ["close", "no close"])
def test_no_connection_is_left_unclosed_at_exit(tmp_path, python, ending):
    done = run_dev(python, SCRIPT, f"sqlite:///{tmp_path}/j.db", ending, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5"]
    assert "ResourceWarning" not in done.stderr, done.stderr


@pytest.mark.parametrize("python", ["current", "3.13"])
def test_the_demo_leaves_no_connection_unclosed(tmp_path, python):
    done = run_dev(python, DEMO, f"sqlite:///{tmp_path}/demo.db", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lost: 0" in done.stdout
    assert "ResourceWarning" not in done.stderr, done.stderr


CYCLE = textwrap.dedent(
    """
    import gc
    import sqlite3
    import sys

    from jobkeeper.backends.sqlite.slots import ThreadConnection

    gc.disable()
    for _ in range(3):
        # The connection made before its slot: first on the collector's list.
        conn = sqlite3.connect(sys.argv[1])
        slot = ThreadConnection()
        slot.hold(conn, None)
        cycle = [slot]
        cycle.append(cycle)
        del conn, slot, cycle
        gc.collect()
    print("collected")
    """
)


@pytest.mark.parametrize("python", ["current", "3.13"])
def test_a_slot_collected_in_a_cycle_closes_its_connection_first(tmp_path, python):
    # A backend dropped unclosed in a reference cycle took its slots and
    # their connections with it; 3.13 finalizes a connection before its
    # slot's __del__ could close it, when the collector meets it first,
    # and warned "unclosed database".
    done = run_dev(python, CYCLE, str(tmp_path / "c.db"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["collected"]
    assert "ResourceWarning" not in done.stderr, done.stderr
