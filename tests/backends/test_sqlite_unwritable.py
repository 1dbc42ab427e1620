"""A SQLite file jobkeeper cannot write: the error says why, not only
SQLite's "unable to open database file".

Root ignores file permissions and the test machines run as root, so the
file system's answers are replaced here (``os.statvfs``, ``os.access`` in
the connection module); the read-only mount itself was checked by hand
with ``mount --bind -o ro`` (see the commit).
"""

from __future__ import annotations

import os
import sqlite3
import types
from pathlib import Path
from typing import Any

import pytest

from jobkeeper import JobQueue
from jobkeeper.backends.sqlite import connection
from jobkeeper.backends.sqlite.connection import not_writable_hint
from jobkeeper.errors import DatabaseUnavailable


def _statvfs(readonly: bool) -> Any:
    return lambda _path: types.SimpleNamespace(f_flag=os.ST_RDONLY if readonly else 0)


def test_a_read_only_file_system_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection.os, "statvfs", _statvfs(True))
    hint = not_writable_hint(str(tmp_path / "q.db"))
    assert f"{str(tmp_path)!r} is on a read-only file system" in hint
    assert "-wal and -shm" in hint


def test_a_file_this_user_cannot_write_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(b"x")
    monkeypatch.setattr(connection.os, "statvfs", _statvfs(False))
    monkeypatch.setattr(connection.os, "access", lambda p, mode: p != str(path))
    assert "the file is not writable by this user" in not_writable_hint(str(path))


def test_a_directory_this_user_cannot_write_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection.os, "statvfs", _statvfs(False))
    monkeypatch.setattr(connection.os, "access", lambda p, mode: p != str(tmp_path))
    hint = not_writable_hint(str(tmp_path / "q.db"))
    assert f"its directory {str(tmp_path)!r} is not writable" in hint
    assert "q.db-wal and q.db-shm" in hint


def test_nothing_seen_adds_nothing(tmp_path: Path) -> None:
    assert not_writable_hint(str(tmp_path / "q.db")) == ""


def test_the_open_error_carries_the_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    JobQueue(url).migrate()
    queue = JobQueue(url)

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(connection.sqlite3, "connect", refuse)
    monkeypatch.setattr(connection.os, "statvfs", _statvfs(True))
    with pytest.raises(DatabaseUnavailable, match=r"unable to open database file -- .* read-only"):
        queue.enqueue("noop", {})
    queue.close()
