"""jobkeeper's connections around Django's test databases (internal).

Django's test runner copies its test database for each parallel worker and
drops it at the end, after closing its own connections (and its own pool)
and without a signal to anyone else. jobkeeper's queues that follow a
Django database have connections of their own there: PostgreSQL refuses to
copy or drop a database others are connected to, and a copy of a SQLite file
misses what jobkeeper's WAL connections have not written back to it yet.
:func:`install` wraps the methods of Django's ``BaseDatabaseCreation`` that
do these (no backend overrides them; they call the backends' own
``_clone_test_db`` and ``_destroy_test_db``) so that jobkeeper lets go first,
and ``create_test_db`` too: a WAL an earlier run left beside a SQLite file
that Django replaces would be replayed into the new one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import shutil
from pathlib import Path
from typing import Any

from django.db.backends.base.creation import BaseDatabaseCreation

from jobkeeper.backends.sqlite.wakechannel import directory_of
from jobkeeper.contrib.django.database import QUEUES, is_in_memory


def install() -> None:
    """Wrap ``create_test_db``, ``clone_test_db`` and ``destroy_test_db``
    (once per process).
    """
    if getattr(BaseDatabaseCreation.clone_test_db, "_jobkeeper_wrapped", False):
        return
    create = BaseDatabaseCreation.create_test_db
    clone = BaseDatabaseCreation.clone_test_db
    destroy = BaseDatabaseCreation.destroy_test_db

    @functools.wraps(create)
    def create_test_db(self: BaseDatabaseCreation, *args: Any, **kwargs: Any) -> Any:
        if not _keeps(create, self, args, kwargs):
            # Django replaces the file; a WAL an earlier run left beside it
            # (a parallel process exits without closing) would be replayed
            # into the new one, whose pages it does not belong to.
            test_file = _sqlite_file(self, str(self._get_test_db_name()))
            if test_file is not None:
                _remove_leftovers(test_file)
        return create(self, *args, **kwargs)

    @functools.wraps(clone)
    def clone_test_db(
        self: BaseDatabaseCreation,
        suffix: Any,
        verbosity: int = 1,
        autoclobber: bool = False,
        keepdb: bool = False,
    ) -> Any:
        QUEUES.close_followers()
        if _sqlite_file(self) is not None:
            # The copy takes the database file alone: what jobkeeper's
            # migrate wrote is still in the WAL until a checkpoint.
            with self.connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            target = _sqlite_file(self, str(self.get_test_db_clone_settings(suffix)["NAME"]))
            if target is not None and not (keepdb and target.exists()):
                _remove_leftovers(target)  # the copy replaces the file: see create
        return clone(self, suffix, verbosity, autoclobber, keepdb)

    @functools.wraps(destroy)
    def destroy_test_db(
        self: BaseDatabaseCreation,
        old_database_name: str | None = None,
        verbosity: int = 1,
        keepdb: bool = False,
        suffix: str | None = None,
    ) -> Any:
        QUEUES.close_followers()
        name = self.connection.settings_dict.get("NAME")
        if suffix is not None:
            name = self.get_test_db_clone_settings(suffix)["NAME"]
        sqlite_file = _sqlite_file(self, str(name or ""))
        try:
            return destroy(self, old_database_name, verbosity, keepdb, suffix)
        finally:
            if sqlite_file is not None and not keepdb and not sqlite_file.exists():
                _remove_leftovers(sqlite_file)

    clone_test_db._jobkeeper_wrapped = True  # type: ignore[attr-defined]
    BaseDatabaseCreation.create_test_db = create_test_db
    BaseDatabaseCreation.clone_test_db = clone_test_db
    BaseDatabaseCreation.destroy_test_db = destroy_test_db


def _sqlite_file(creation: BaseDatabaseCreation, name: str | None = None) -> Path | None:
    """The SQLite file of the connection (or named ``name``), or None
    (another engine, or an in-memory database).
    """
    if creation.connection.vendor != "sqlite":
        return None
    if name is None:
        name = str(creation.connection.settings_dict.get("NAME") or "")
    return None if is_in_memory(name) else Path(name).resolve()


def _keeps(create: Any, creation: BaseDatabaseCreation, args: Any, kwargs: Any) -> bool:
    """Whether this ``create_test_db`` call keeps the database (``keepdb``)."""
    return bool(inspect.signature(create).bind(creation, *args, **kwargs).arguments.get("keepdb"))


def _remove_leftovers(sqlite_file: Path) -> None:
    """What jobkeeper left beside a test database Django deleted or replaces:
    the WAL and shared-memory files of connections a parallel test process
    never closed (it exits without), and the wake channel's directory.
    """
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.remove(f"{sqlite_file}{suffix}")
    shutil.rmtree(directory_of(str(sqlite_file)), ignore_errors=True)
