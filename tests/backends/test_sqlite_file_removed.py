"""SQLite: a database file removed or replaced while a process has it open.

SQLite writes on into the open (deleted) file without a word; every write
transaction now checks that the file at the path is still the one its
connection opened (``file_identity``: the path's st_dev/st_ino), before its
commit and after, and a worker's heartbeat does so before each beat. The
worker side with real processes is in ``tests/e2e/test_sqlite_file_removed.py``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobkeeper import DatabaseError, JobQueue
from jobkeeper.backends.sqlite import connection, files
from jobkeeper.backends.sqlite.backend import SqliteBackend
from jobkeeper.models import WorkerInfo
from support.db import sql


def _queue(path: Path) -> JobQueue:
    jq = JobQueue(f"sqlite:///{path}", external_tasks=True)
    jq.migrate()
    return jq


def _replace(path: Path) -> None:
    """Another migrated file at ``path`` (what a restore does)."""
    fresh = path.with_name("fresh.db")
    maker = _queue(fresh)
    maker.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(fresh, path)


def _ids(path: Path) -> list[int]:
    return [int(row[0]) for row in sql(f"sqlite:///{path}", "SELECT id FROM jobkeeper_jobs")]


def test_enqueue_after_the_directory_is_removed_raises_naming_the_path(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    jq = _queue(directory / "jobs.db")
    jq.enqueue("t", {"i": 0})
    shutil.rmtree(directory)
    with pytest.raises(DatabaseError, match="was removed while this process had it open") as err:
        jq.enqueue("t", {"i": 1})
    assert str(directory / "jobs.db") in str(err.value)
    assert "nothing was written" in str(err.value)
    # Then what any call on a missing directory says.
    with pytest.raises(DatabaseError, match="does not exist"):
        jq.enqueue_many([("t", {"i": 2}), ("t", {"i": 3})])
    jq.close()


def test_enqueue_after_the_file_is_replaced_raises_once_then_uses_the_new_file(
    tmp_path: Path,
) -> None:
    db = tmp_path / "jobs.db"
    jq = _queue(db)
    jq.enqueue("t", {"i": 0})
    _replace(db)
    with pytest.raises(DatabaseError, match="was replaced by another file"):
        jq.enqueue("t", {"i": 1})
    assert _ids(db) == []  # nothing of the refused call anywhere at the path
    # An application's queue is not pinned: it writes into the file now at
    # the path, where a worker started on it finds the job.
    job = jq.enqueue("t", {"i": 2})
    assert _ids(db) == [job.id]
    jq.close()


def test_a_removal_between_the_check_and_the_commit_is_not_reported_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    jq = _queue(directory / "jobs.db")
    jq.enqueue("t", {"i": 0})
    check = connection.SqliteConnection._check_file

    def check_then_remove(self: connection.SqliteConnection, *, committed: bool = False) -> None:
        check(self, committed=committed)
        if not committed:
            shutil.rmtree(directory)  # just after the check before the COMMIT

    monkeypatch.setattr(connection.SqliteConnection, "_check_file", check_then_remove)
    with pytest.raises(DatabaseError, match=r"went to the removed file: .* not stored"):
        jq.enqueue("t", {"i": 1})
    monkeypatch.undo()
    jq.close()


def test_a_workers_backend_stays_on_its_file_and_its_beat_says_so(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    jq = _queue(db)
    pinned = jq.backend.dedicated("heartbeat")
    assert isinstance(pinned, SqliteBackend)
    info = _worker_info()
    pinned.worker_register(worker=info)
    pinned.worker_heartbeat(worker=info)
    _replace(db)
    with pytest.raises(DatabaseError, match="was replaced by another file"):
        pinned.worker_heartbeat(worker=info)
    # Its next connection opens the new file, and refuses it: a worker never
    # carries on (nor registers again) in a file it did not start on.
    with pytest.raises(DatabaseError, match="not the file this worker started on"):
        pinned.worker_heartbeat(worker=info)
    assert sql(f"sqlite:///{db}", "SELECT count(*) FROM jobkeeper_workers")[0][0] == 0
    pinned.close()
    jq.close()


def _worker_info() -> WorkerInfo:
    now = datetime.now(UTC)
    return WorkerInfo(
        id="test:1:abc",
        hostname="test",
        pid=1,
        queues=["default"],
        started_at=now,
        heartbeat_at=now,
        rescue_after=60.0,
    )


def test_the_file_identity_is_the_paths(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    assert files.file_identity(str(path)) is None
    sqlite3.connect(path).close()
    st = os.stat(path)
    assert files.file_identity(str(path)) == (st.st_dev, st.st_ino)
    assert files.file_identity(str(tmp_path / "gone" / "x.db")) is None


@pytest.mark.parametrize("removed", ["file", "directory"])
def test_enqueue_through_a_callers_connection_on_a_removed_file(
    tmp_path: Path, removed: str
) -> None:
    """``connection=conn`` on a file removed since ``conn`` opened it: the
    insert went into the caller's transaction on the deleted file, and
    ``enqueue`` returned a job that is in no file. Refused before jobkeeper
    writes anything (the caller's commit is the caller's).
    """
    directory = tmp_path / "d"
    directory.mkdir()
    db = directory / "jobs.db"
    jq = _queue(db)
    conn = sqlite3.connect(db, isolation_level=None)
    jq.enqueue("t", {"i": 0}, connection=conn)
    if removed == "file":
        for name in ("jobs.db", "jobs.db-wal", "jobs.db-shm"):
            (directory / name).unlink(missing_ok=True)
    else:
        shutil.rmtree(directory)
    conn.execute("BEGIN")
    with pytest.raises(DatabaseError, match="was removed while connection= had it open") as err:
        jq.enqueue("t", {"i": 1}, connection=conn)
    assert str(db) in str(err.value) and "not written" in str(err.value)
    with pytest.raises(DatabaseError, match="was removed while connection= had it open"):
        jq.enqueue_many([("t", {"i": 2})], connection=conn)
    assert conn.execute("SELECT count(*) FROM jobkeeper_jobs").fetchone() == (1,)
    conn.execute("ROLLBACK")
    conn.close()
    jq.close()


def test_migrate_through_a_symlinked_directory_sees_the_open_wal(tmp_path: Path) -> None:
    # /proc's links name the real path: through a symlinked directory the
    # refusal was skipped, migrate failed with "disk I/O error" and left an
    # empty file beside the -wal and -shm still open (break-test 127).
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    JobQueue(f"sqlite:///{real / 'jobs.db'}").migrate()
    holder = sqlite3.connect(real / "jobs.db")  # a process still on the file
    try:
        holder.execute("PRAGMA journal_mode=WAL")
        holder.execute("SELECT count(*) FROM jobkeeper_jobs").fetchone()
        (real / "jobs.db").unlink()
        with pytest.raises(DatabaseError, match=r"jobs\.db-wal and jobs\.db-shm"):
            JobQueue(f"sqlite:///{tmp_path / 'link' / 'jobs.db'}").migrate()
        assert not (real / "jobs.db").exists()
    finally:
        holder.close()
