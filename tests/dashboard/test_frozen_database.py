"""Pages, /metrics and actions answer 503 within the dashboard's
database_timeout while the database does not answer, and work again once it
does.

Found by a break-test: with the PostgreSQL server SIGSTOPped (it accepts and
never answers), ``curl -m 200 /metrics`` and ``/`` hung the full 200 s, each
holding a threadpool thread.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from benchmarks.soak.pg import PrivatePostgres
from starlette.testclient import TestClient

from jobkeeper import JobQueue
from jobkeeper.dashboard import create_app
from jobkeeper.dashboard.app import PASSWORD_ENV
from jobkeeper.errors import ConfigError
from support.settings import FAST

from .conftest import _token
from .seed import seed
from .test_cli_and_doctor import run

PAGES = ["/", "/metrics", "/jobs", "/jobs/1", "/dead", "/workers", "/queues", "/periodic"]
BOUND = 0.5
#: Slack over the bound for a loaded 2-core machine; the hang was unbounded.
SLACK = 3.0


class _Freezable:
    """A backend whose every call waits while ``frozen``: a server that
    accepts and never answers.
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.thawed = threading.Event()
        self.thawed.set()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._backend, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self.thawed.wait(60)
            return value(*args, **kwargs)

        return call


def _timed(request: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    response = request()
    return response, time.monotonic() - started


def _assert_unanswered(response: Any, took: float, bound: float) -> None:
    assert response.status_code == 503, response.text[:300]
    assert f"the database did not answer within {bound:g}s" in response.text
    assert response.headers["retry-after"] == "5"
    assert took < bound + SLACK, f"answered after {took:.1f}s"


def test_pages_answer_503_within_the_bound_while_the_database_hangs(jq, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    seed(jq)
    freezable = _Freezable(jq.backend)
    jq._backend = freezable  # type: ignore[assignment]
    try:
        with TestClient(create_app(jq, database_timeout=BOUND)) as client:
            for page in PAGES:
                assert client.get(page).status_code == 200, page
            token = _token(client, "/queues")
            freezable.thawed.clear()
            # More requests than the dashboard has threads: later ones wait
            # for a thread, and are answered at the bound too.
            for page in PAGES + PAGES:
                _assert_unanswered(*_timed(lambda page=page: client.get(page)), BOUND)
            pause = client.post(
                "/queues/pause",
                data={"csrf_token": token, "queue": "emails"},
                follow_redirects=False,
            )
            assert pause.status_code == 503
            # Break-test: the action's 503 spoke only of "the page".
            assert "the action may still take effect once it answers" in pause.text, pause.text
            # And it names what keeps this backend from answering.
            why = "write lock" if jq.url.scheme == "sqlite" else "accepts and never answers"
            assert why in pause.text, pause.text
            freezable.thawed.set()
            for page in PAGES:
                assert client.get(page).status_code == 200, page
    finally:
        freezable.thawed.set()
        jq._backend = freezable._backend


def test_a_sqlite_action_behind_the_write_lock_lets_go_of_its_thread_at_the_bound(
    sqlite_url, monkeypatch
):
    # Break-test: the POST was answered 503 at database_timeout, but the
    # pause went on waiting busy_timeout (30 s) for the lock, holding one
    # of the dashboard's 8 threads. SQLite only: a PostgreSQL connection is
    # pooled, no thread's (connection_lock_wait does nothing there).
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    jq = JobQueue(sqlite_url, **FAST)
    jq.migrate()
    seed(jq)
    ended = threading.Event()
    real_pause = jq.pause

    def pause(queue: str) -> Any:
        try:
            return real_pause(queue)
        finally:
            ended.set()

    monkeypatch.setattr(jq, "pause", pause)
    try:
        with TestClient(create_app(jq, database_timeout=BOUND)) as client:
            token = _token(client, "/queues")
            form = {"csrf_token": token, "queue": "emails"}
            holder = sqlite3.connect(jq.backend.path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            try:
                response, took = _timed(
                    lambda: client.post("/queues/pause", data=form, follow_redirects=False)
                )
                assert response.status_code == 503 and took < BOUND + SLACK
                assert ended.wait(BOUND + SLACK), "the pause held its thread past the bound"
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            assert not any(q.paused for q in jq.queues())  # it gave up: nothing written
            # Only the dashboard's threads are bound: this one (as a worker's) waits 30 s.
            assert jq.backend._busy_timeout() == 30.0
            assert jq.backend._conn().execute("PRAGMA busy_timeout").fetchone() == (30_000,)
            assert client.post("/queues/pause", data=form, follow_redirects=False).is_redirect
            assert [q.name for q in jq.queues() if q.paused] == ["emails"]
    finally:
        jq.close()


def test_database_timeout_must_be_a_positive_number(jq):
    for bad in (0, -1, float("inf"), float("nan"), "5"):
        with pytest.raises(ConfigError, match="database_timeout"):
            create_app(jq, database_timeout=bad)


@pytest.mark.parametrize("bad", ["nan", "0", "1e-9", "86401"])
def test_the_cli_refuses_a_bad_database_timeout_before_serving(jq, capsys, bad):
    # Break-test: nan passed the option's range, the banner said the
    # dashboard served, then it failed; 1e-9 made every page a 503.
    code, out, err = run(capsys, "--database", jq.url.url, "dashboard", "--database-timeout", bad)
    assert code == 2, (out, err)
    assert "--database-timeout" in err and "dashboard on http" not in out


@pytest.mark.slow
def test_a_sigstopped_postgres_gets_a_503_and_the_pages_come_back(monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    pg = PrivatePostgres(database="frozen")
    try:
        pg.init()
        jq = JobQueue(pg.url)
        jq.migrate()
        seed(jq)
        bound = 1.0
        with TestClient(create_app(jq, database_timeout=bound)) as client:
            assert client.get("/").status_code == 200
            assert client.get("/metrics").status_code == 200
            pg.signal_all(signal.SIGSTOP)
            try:
                for page in ("/", "/metrics", "/queues", "/"):
                    _assert_unanswered(*_timed(lambda page=page: client.get(page)), bound)
            finally:
                pg.signal_all(signal.SIGCONT)
            deadline = time.monotonic() + 30
            while client.get("/").status_code != 200:
                assert time.monotonic() < deadline, "the overview did not come back"
                time.sleep(0.2)
            assert client.get("/metrics").status_code == 200
        jq.close()
    finally:
        pg.cleanup()
