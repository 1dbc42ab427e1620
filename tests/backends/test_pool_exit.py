"""A script that never closes its PostgreSQL ``JobQueue`` exits at once, on
every Python: its pool is closed at exit (``backends/postgres/pool_exit``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import psycopg
import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.postgres import pool_exit
from support.db import PG_URL
from support.pythons import python_with_jobkeeper

# The quick start's app module and two-line enqueue script. The queue must
# live in an imported module: one of __main__ is collected early enough in
# finalization that its pool's threads still run.
APP = textwrap.dedent(
    """
    import os

    from jobkeeper import JobQueue

    jq = JobQueue(os.environ["JOBKEEPER_DATABASE_URL"])


    @jq.task(queue="images", max_attempts=5)
    def resize(path: str, width: int) -> dict:
        return {"path": path, "width": width}
    """
)
SCRIPT = textwrap.dedent(
    """
    from myapp.jobs import resize

    print(resize.enqueue(path="a.png", width=100).id, flush=True)
    """
)


@pytest.mark.parametrize("python", ["current", "3.13"])
def test_a_script_that_never_closes_its_queue_exits_at_once(pg_url, tmp_path: Path, python):
    # On 3.13 psycopg_pool's ConnectionPool.__del__ ran at finalization,
    # after its daemon threads were frozen, and joined each for 5 s: the
    # quick start's two-line enqueue script took 20 s to exit (3.12: 0.4 s).
    interpreter = sys.executable if python == "current" else str(python_with_jobkeeper(python))
    with JobQueue(pg_url) as jq:
        jq.migrate()
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(APP)
    (tmp_path / "enqueue.py").write_text(SCRIPT)
    started = time.monotonic()
    done = subprocess.run(
        [interpreter, "enqueue.py"],
        cwd=tmp_path,
        env={**os.environ, "JOBKEEPER_DATABASE_URL": pg_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert took < 5.0, f"the script took {took:.1f}s to exit: {done.stderr}"
    with JobQueue(pg_url) as jq:
        job = jq.get_job(int(done.stdout))
        assert job is not None and job.args == {"path": "a.png", "width": 100}


def test_a_queue_used_after_its_pool_was_closed_at_exit_reconnects(pg_url):
    # What a later atexit hook (run after ours) would do: the queue goes on
    # as after close(), and its new pool is closed at exit again.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        source = jq.backend._source
        first = jq.enqueue("anything", {})
        assert source in pool_exit._open
        pool_exit._release_open()
        assert source not in pool_exit._open
        again = jq.enqueue("anything", {})
        assert source in pool_exit._open
        assert {job.id for job in jq.list_jobs(limit=10)} == {first.id, again.id}
    finally:
        jq.close()
    assert source not in pool_exit._open


def test_a_forked_child_leaves_its_parents_pool_alone(pg_url):
    # The child inherits the hook and the parent's open source; closing it
    # at the child's exit would end (send a Terminate on) the parent's sessions.
    jq = JobQueue(pg_url)
    jq.migrate()
    try:
        jq.enqueue("anything", {})
        pool = jq.backend._source._pool
        sessions = {conn.info.backend_pid for conn in list(pool._pool)}
        assert sessions
        with warnings.catch_warnings():
            # 3.12+: "This process is multi-threaded, use of fork() may lead
            # to deadlocks": the child only runs the hook and exits.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: run the hook, as its exit would
            try:
                pool_exit._release_open()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.2)
        with psycopg.connect(PG_URL) as conn:
            alive = {
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(sessions)]
                )
            }
        assert alive == sessions
    finally:
        jq.close()
