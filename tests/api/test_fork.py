"""A JobQueue used before ``os.fork()`` works in the parent and in every
child (``backends/forks.py``), in real processes on both backends.

Before: the children's statements went on the parent's PostgreSQL sockets
(the parent and two of three children failed at once, "server closed the
connection unexpectedly"), a child's exit or ``close()`` ended the parent's
sessions, and on SQLite a child used (and closed) its parent's sqlite3
connections, which SQLite says can corrupt the file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobkeeper import JobQueue
from support.db import count, is_pg

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")

# What every script starts with: the queue, and the sessions (PostgreSQL)
# or connection (SQLite) the parent holds.
PRELUDE = textwrap.dedent(
    """
    import asyncio, json, os, sys, threading, warnings
    warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
    import psycopg
    from jobkeeper import JobQueue

    URL = sys.argv[1]
    PG = URL.startswith("postgres")
    jq = JobQueue(URL, external_tasks=True)

    def sessions():
        # The backend pids of the parent's pooled sessions.
        return sorted(c.info.backend_pid for c in list(jq.backend._source._pool._pool))

    def alive(pids):
        with psycopg.connect(os.environ["JOBKEEPER_TEST_SERVER"]) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
            ).fetchall()
        return sorted(row[0] for row in rows)

    def wait_children(pids):
        codes = []
        for pid in pids:
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        return codes
    """
)

CONCURRENT = PRELUDE + textwrap.dedent(
    """
    jq.enqueue("f", {"who": "first"})  # opens the parent's pool (or its connection)
    before = sessions() if PG else None
    parent_conn = None if PG else jq.backend._thread().conn
    # SQLite: another thread's connection too, whose locals the fork drops.
    other = {}
    if not PG:
        ready = threading.Event()
        def use():
            jq.enqueue("f", {"who": "thread"})
            other["conn"] = jq.backend._thread().conn
            ready.set()
            threading.Event().wait()
        threading.Thread(target=use, daemon=True).start()
        ready.wait()
    kids = []
    for n in range(3):
        pid = os.fork()
        if pid == 0:
            done, error = 0, None
            try:
                for i in range(100):
                    jq.enqueue("f", {"who": n, "i": i})
                    done += 1
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            report = {"child": n, "done": done, "error": error}
            if not PG:
                own = jq.backend._thread().conn
                report["own_connection"] = own is not None and own is not parent_conn
                try:
                    other["conn"].total_changes  # closed in the child: raises
                    report["inherited_open"] = True
                except Exception:
                    report["inherited_open"] = False
            # One write: print's text and its newline can go out apart, and
            # two children's lines ran together.
            os.write(1, (json.dumps(report) + "\\n").encode())
            sys.exit(0)  # a normal exit: finalizers run, atexit hooks too
        kids.append(pid)
    done, error = 0, None
    try:
        for i in range(100):
            jq.enqueue("f", {"who": "parent", "i": i})
            done += 1
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    codes = wait_children(kids)
    jq.enqueue("f", {"who": "last"})
    report = {"child": None, "done": done, "error": error, "codes": codes}
    if PG:
        report["before"] = before
        report["alive"] = alive(before)
    print(json.dumps(report), flush=True)
    jq.close()
    """
)


def _run(script: str, url: str, timeout: float = 120) -> list[dict[str, Any]]:
    server = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    run = subprocess.run(
        [sys.executable, "-c", script, url],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "JOBKEEPER_TEST_SERVER": server},
    )
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def test_parent_and_three_children_enqueue_at_once(db_url: str) -> None:
    with JobQueue(db_url) as jq:
        jq.migrate()
    reports = _run(CONCURRENT, db_url)
    children = sorted((r for r in reports if r["child"] is not None), key=lambda r: r["child"])
    parent = next(r for r in reports if r["child"] is None)
    assert [(r["done"], r["error"]) for r in children] == [(100, None)] * 3
    assert (parent["done"], parent["error"], parent["codes"]) == (100, None, [0, 0, 0])
    if is_pg(db_url):
        # The children's exits (finalizers, atexit) did not end them.
        assert parent["before"] and parent["alive"] == parent["before"]
    else:
        assert all(r["own_connection"] for r in children), children
        assert all(r["inherited_open"] for r in children), children
    # first, (SQLite) the other thread's, the children's, the parent's, last
    assert count(db_url) == 1 + (0 if is_pg(db_url) else 1) + 300 + 100 + 1


MP_POOL = PRELUDE + textwrap.dedent(
    """
    import multiprocessing

    def batch(n):
        ids = [jq.enqueue("f", {"batch": n, "i": i}).id for i in range(50)]
        # SQLite: the child wrote on a connection of its own.
        return ids, PG or jq.backend._thread().conn is not PARENT_CONN

    if __name__ == "__main__":
        jq.enqueue("f", {"who": "first"})
        before = sessions() if PG else None
        PARENT_CONN = None if PG else jq.backend._thread().conn
        with multiprocessing.get_context("fork").Pool(3) as pool:
            pending = pool.map_async(batch, range(6))
            mine = [jq.enqueue("f", {"who": "parent", "i": i}).id for i in range(50)]
            results = pending.get(60)
        ids = [i for chunk, _ in results for i in chunk]
        report = {"ids": len(set(ids)), "mine": len(mine), "own": [own for _, own in results]}
        if PG:
            report["before"] = before
            report["alive"] = alive(before)
        jq.enqueue("f", {"who": "last"})
        print(json.dumps(report), flush=True)
        jq.close()
    """
)


def test_a_fork_pool_of_multiprocessing_enqueues(db_url: str) -> None:
    with JobQueue(db_url) as jq:
        jq.migrate()
    (report,) = _run(MP_POOL, db_url)
    assert (report["ids"], report["mine"], report["own"]) == (300, 50, [True] * 6)
    if is_pg(db_url):
        assert report["before"] and report["alive"] == report["before"]
    assert count(db_url) == 1 + 300 + 50 + 1


APP = textwrap.dedent(
    """
    import atexit, gc, os, time
    import psycopg
    from jobkeeper import JobQueue

    jq = JobQueue(
        os.environ["URL"], heartbeat_interval=0.1, rescue_after=2.0, poll_interval=0.05
    )

    @jq.task
    def double(x: int) -> int:
        return 2 * x

    def worker_sessions():
        # This worker process's sessions: its API pool's, and its own
        # connections (named "jobkeeper <role> <host>:<pid>:<random>").
        pooled = [c.info.backend_pid for c in list(jq.backend._source._pool._pool)]
        with psycopg.connect(os.environ["SERVER"]) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s) "
                "OR application_name LIKE %s",
                [pooled, f"jobkeeper %:{os.getpid()}:%"],
            ).fetchall()
        return {row[0] for row in rows}

    @jq.task
    def fork_and_leave(how: str) -> str:
        # The child leaves the task as "how" says, instead of os._exit.
        pid = os.fork()
        if pid == 0:
            if how == "exit":
                raise SystemExit(3)
            if how == "raise":
                raise ValueError("raised in the child")
            return "returned in the child"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return f"child exited {os.waitstatus_to_exitcode(status)}"
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "child still running after 20 s"

    @jq.task
    def forker() -> list:
        jq.enqueue("double", {"x": 0})  # this worker's API pool, in use
        before = worker_sessions()
        pid = os.fork()
        if pid == 0:
            # The child enqueues through the task's queue, then does what an
            # exit does to it: atexit hooks, the queue closed, collection.
            try:
                jq.enqueue("double", {"x": 100})
                atexit._run_exitfuncs()
                jq.close()
                gc.collect()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.5)  # a Terminate sent by the child ends its session meanwhile
        return sorted(before - worker_sessions())
    """
)


@pytest.fixture
def worker(db_url: str, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A worker process running APP's tasks on ``db_url``; calling the
    fixture's value stops it and returns its log.
    """
    with JobQueue(db_url) as jq:
        jq.migrate()
    (tmp_path / "forkapp.py").write_text(APP)
    server = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import logging; logging.basicConfig(level=logging.INFO); "
                "from forkapp import jq; jq.run_worker(concurrency=2)",
            ],
            cwd=tmp_path,
            env={**os.environ, "URL": db_url, "SERVER": server, "PYTHONPATH": str(tmp_path)},
            stderr=out,
        )

    def stop() -> str:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return log.read_text()

    try:
        yield stop
    finally:
        stop()


WAITS = PRELUDE + textwrap.dedent(
    """
    import concurrent.futures

    first = jq.wait(jq.enqueue("double", {"x": 1}).id, timeout=30)  # the parent's watch
    # An application's event loop in a thread of its own, which has used
    # the async API: its pool, and the spare connection it keeps.
    app_loop = asyncio.new_event_loop()
    threading.Thread(target=app_loop.run_forever, daemon=True).start()

    def on_app_loop(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, app_loop).result(60)

    async def calls(xs, sync_x):
        ids = [(await jq.enqueue_async("double", {"x": x})).id for x in xs]
        done = await jq.wait_async(ids[-1], timeout=30)
        return done, await asyncio.to_thread(
            jq.wait, jq.enqueue("double", {"x": sync_x}).id, timeout=30
        )

    second = on_app_loop(jq.wait_async(on_app_loop(jq.enqueue_async("double", {"x": 2})).id, 30))
    # PostgreSQL: the parent's sessions (its sync pool's, its loop's pool's).
    before = sessions() + sorted(
        c.info.backend_pid for p in jq.backend._async_pools.values()
        for c in p.opened if not c.closed
    ) if PG else None
    parent_conn = None if PG else jq.backend._thread().conn
    pid = os.fork()
    if pid == 0:
        out = {"child": True}
        try:
            out["async"], out["sync"] = asyncio.run(calls(range(20), 50))
            out["wait"] = jq.wait(jq.enqueue("double", {"x": 70}).id, timeout=30)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        # SQLite: this thread's calls went on a connection of the child's own.
        out["own"] = PG or jq.backend._thread().conn is not parent_conn
        print(json.dumps(out), flush=True)
        jq.close()  # closes the pools this child opened, nothing of its parent's
        sys.exit(0)
    out = {"child": False, "first": first, "second": second}
    try:
        out["async"], out["sync"] = on_app_loop(calls(range(20, 40), 60))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["code"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out["gone"] = sorted(set(before) - set(alive(before))) if PG else []
    print(json.dumps(out), flush=True)
    app_loop.call_soon_threadsafe(app_loop.stop)
    """
)


def test_wait_and_enqueue_async_in_a_child(db_url: str, worker: Callable[[], str]) -> None:
    reports = {r["child"]: r for r in _run(WAITS, db_url)}
    assert reports[True] == {"child": True, "async": 38, "sync": 100, "wait": 140, "own": True}
    # The parent's sessions all outlived the child's close() and exit.
    assert reports[False] == {
        "child": False,
        "first": 2,
        "second": 4,
        "async": 78,
        "sync": 120,
        "code": 0,
        "gone": [],
    }


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_task_that_forks_leaves_its_workers_sessions_alone(
    db_url: str, worker: Callable[[], str]
) -> None:
    # SQLite has no sessions to end: what its child did to the parent's
    # connections cannot be seen from the parent.
    with JobQueue(db_url) as jq:
        job = jq.enqueue("forker", {})
        assert jq.wait(job.id, timeout=60) == []  # none of the worker's sessions ended
        done = jq.get_job(job.id)
        assert done is not None and done.attempt == 1
        # The child's enqueue, and the task's own, stored once each.
        assert sorted(j.args["x"] for j in jq.list_jobs(limit=10) if j.task == "double") == [0, 100]
    worker_log = worker()  # stopped: nothing was lost or rescued
    trouble = [
        line
        for line in worker_log.splitlines()
        if line.startswith(("WARNING", "ERROR")) and "autovacuum" not in line
    ]
    assert trouble == [], worker_log
    assert "completed, 0 failed" in worker_log, worker_log


def test_a_child_forked_in_a_task_ends_when_it_leaves_the_task(
    db_url: str, worker: Callable[[], str]
) -> None:
    # A child that returned from the task (or raised, or called sys.exit)
    # went on as a copy of the worker's runner and hung, and its parent's
    # waitpid with it. It ends as sys.exit ends a script.
    with JobQueue(db_url) as jq:
        jobs = {
            how: jq.enqueue("fork_and_leave", {"how": how}) for how in ("return", "exit", "raise")
        }
        results = {how: jq.wait(job.id, timeout=60) for how, job in jobs.items()}
        assert results == {
            "return": "child exited 0",
            "exit": "child exited 3",
            "raise": "child exited 1",
        }
        for job in jobs.values():
            done = jq.get_job(job.id)
            assert done is not None and done.attempt == 1
    worker_log = worker()
    trouble = [
        line
        for line in worker_log.splitlines()
        if line.startswith(("WARNING", "ERROR")) and "autovacuum" not in line
    ]
    assert trouble == [], worker_log
    assert "3 completed, 0 failed" in worker_log, worker_log


MID_WRITE = textwrap.dedent(
    """
    import json, os, sys, threading, warnings
    warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
    from jobkeeper import JobQueue

    jq = JobQueue(sys.argv[1], external_tasks=True, busy_timeout=3.0)
    jq.migrate()
    jq.enqueue("anything", {})
    inside, forked = threading.Event(), threading.Event()

    def writer():
        with jq.backend._write():  # BEGIN IMMEDIATE: the write lock held
            inside.set()
            forked.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    inside.wait(30)
    pid = os.fork()
    if pid == 0:
        try:
            jq.enqueue("anything", {"from": "child"})
            out = {"child": True, "error": None}
        except Exception as exc:
            out = {"child": True, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)
        os._exit(0)
    forked.set()
    thread.join()
    jq.enqueue("anything", {"from": "parent"})
    os.waitpid(pid, 0)
    print(json.dumps({"child": False, "jobs": len(jq.list_jobs(limit=10))}), flush=True)
    """
)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_sqlite_child_forked_mid_write_is_told_it_cannot_write(db_url: str) -> None:
    # SQLite keeps a process's locks in the process: the child's copy of the
    # writing thread's connection (kept, never closed) holds the write lock
    # for good. Each write of the child waited out busy_timeout, then failed
    # as "stayed locked" (break-test 127: 29 of 40 children stuck).
    reports = {r["child"]: r for r in _run(MID_WRITE, db_url)}
    error = reports[True]["error"]
    assert error is not None and error.startswith("DatabaseError: "), error
    assert "forked while a thread of its parent was writing" in error
    assert reports[False] == {"child": False, "jobs": 2}  # the parent writes on
    assert count(db_url) == 2
