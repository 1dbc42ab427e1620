"""SQLite's wake-ups through the one listening protocol every backend has:
another connection's commit and an in-process enqueue both reach
``on_queue("*")`` on the listener thread, within milliseconds.
"""

from __future__ import annotations

import sqlite3
import threading
import time

from jobkeeper import JobQueue
from jobkeeper.backends.sqlite import wakeups
from support.waiting import DEADLINE

HOUR = 3600.0


def _listen(jq: JobQueue) -> tuple[list[float], threading.Event, threading.Thread]:
    heard: list[float] = []
    stop = threading.Event()
    backend = jq.backend.dedicated()

    def run() -> None:
        try:
            backend.listen(on_queue=lambda q: heard.append(time.monotonic()), stop=stop)
        finally:
            backend.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return heard, stop, thread


def _until_listening(jq: JobQueue, heard: list[float]) -> None:
    """In-process wake-ups until two were heard: the listener's loop has then
    read its first ``data_version`` (its first pass reads it, and a pass
    hears at most one wake-up).
    """
    deadline = time.monotonic() + 10
    while len(heard) < 2 and time.monotonic() < deadline:
        jq.backend.wake_listeners()  # type: ignore[attr-defined]
        time.sleep(0.005)
    assert len(heard) >= 2, "the listener never started"
    heard.clear()


def _wait_heard(heard: list[float], after: float) -> float:
    """The first wake-up heard at or after ``after`` (``time.monotonic()``)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        late = [t for t in list(heard) if t >= after]
        if late:
            return late[0]
        time.sleep(0.005)
    raise AssertionError("no wake-up")


def test_a_commit_by_another_connection_wakes_the_listener(sqlite_url):
    with JobQueue(sqlite_url) as jq:
        jq.migrate()
        heard, stop, thread = _listen(jq)
        try:
            _until_listening(jq, heard)
            other = sqlite3.connect(jq.url.path, isolation_level=None)
            try:
                committed = time.monotonic()
                other.execute("CREATE TABLE elsewhere (x)")
            finally:
                other.close()
            assert _wait_heard(heard, committed) - committed < 1.0
        finally:
            stop.set()
            thread.join(5)
        assert not thread.is_alive()


def test_an_enqueue_in_this_process_wakes_the_listener_at_once(sqlite_url):
    with JobQueue(sqlite_url) as jq:
        jq.migrate()
        heard, stop, thread = _listen(jq)
        try:
            _until_listening(jq, heard)
            enqueued = time.monotonic()
            jq.enqueue("anything", {})
            _wait_heard(heard, enqueued)
        finally:
            stop.set()
            thread.join(5)
        assert not thread.is_alive()


def test_a_wake_up_reaches_on_queue_without_waiting_for_a_read(tmp_path, monkeypatch):
    # The listener's data_version reads hang after the first one, and only
    # the first is scheduled (the polls are an hour apart): a wake-up must be
    # passed on by itself, not after a read of the file.
    monkeypatch.setattr(wakeups, "CHANNEL_POLL", HOUR)
    monkeypatch.setattr(wakeups, "CHANGE_POLL", HOUR)
    path = str(tmp_path / "jobs.db")
    first_read, release = threading.Event(), threading.Event()
    reads = 0

    def data_version() -> int:
        nonlocal reads
        reads += 1
        if first_read.is_set():
            release.wait(DEADLINE)
        first_read.set()
        return reads

    heard, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=wakeups.listen, args=(path, data_version, lambda q: heard.set(), stop), daemon=True
    )
    thread.start()
    try:
        assert first_read.wait(DEADLINE)
        wakeups.wake(path)
        assert heard.wait(DEADLINE), "the wake-up waited for a read of the file"
        assert reads == 1
    finally:
        release.set()
        stop.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
