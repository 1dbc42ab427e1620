"""The SQLite backend's worker registry and leader leases (internal)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from jobkeeper.backends.shared import SharedReads
from jobkeeper.backends.sqlite.connection import SqliteConnection
from jobkeeper.backends.sqlite.queries import QUERIES
from jobkeeper.models import WorkerInfo


class SqliteWorkers(SqliteConnection, SharedReads):
    """The ``worker_*`` and ``leader_*`` operations of the SQLite backend."""

    # -- workers ------------------------------------------------------------

    def worker_register(self, *, worker: WorkerInfo) -> None:
        with self._write() as conn:
            conn.execute(QUERIES["worker_register"], self._worker_params(worker))

    def worker_heartbeat(self, *, worker: WorkerInfo) -> None:
        # One autocommit statement: SQLite takes the write lock and commits
        # inside a single step, so the lock is never held while this thread
        # waits for the GIL between BEGIN, UPDATE and COMMIT.
        with self._errors():
            conn = self._conn()
            if conn.in_transaction:
                # Only after a ROLLBACK that itself failed: a beat must never
                # join (and vanish with) a transaction nobody will commit.
                conn.execute("ROLLBACK")
            # A beat into a removed or replaced file would keep a worker
            # serving a file nobody enqueues into: the worker stops on it.
            self._check_file()
            updated = self._take_write_lock(
                conn, lambda: conn.execute(QUERIES["worker_heartbeat"], {"id": worker.id}).rowcount
            )
        if updated == 0:
            # Pruned while paused: come back; old claims stay fenced off.
            with self._write() as conn:
                conn.execute(QUERIES["worker_register"], self._worker_params(worker))

    def worker_deregister(self, *, worker_id: str) -> None:
        with self._write() as conn:
            conn.execute(QUERIES["worker_deregister"], {"id": worker_id})

    def worker_prune_stale(self, *, older_than: float, now: datetime | None = None) -> int:
        params = {"older_than": older_than, "now": self._now_param(now)}
        if not self._probe("worker_prune_stale_probe", params):
            return 0
        with self._write() as conn:
            return conn.execute(QUERIES["worker_prune_stale"], params).rowcount

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=row["id"],
                hostname=row["hostname"],
                pid=row["pid"],
                queues=json.loads(row["queues"]),
                started_at=datetime.fromtimestamp(row["started_at"], UTC),
                heartbeat_at=datetime.fromtimestamp(row["heartbeat_at"], UTC),
                rescue_after=row["rescue_after"],
                version=row["version"],
            )
            for row in self._fetch("worker_list")
        ]

    # -- leadership -----------------------------------------------------------

    def leader_try_acquire(
        self, *, name: str, worker_id: str, ttl: float, now: datetime | None = None
    ) -> bool:
        params = {"name": name, "worker_id": worker_id, "ttl": ttl, "now": self._now_param(now)}
        with self._write() as conn:
            return bool(conn.execute(QUERIES["leader_try_acquire"], params).fetchall())

    def leader_resign(self, *, name: str, worker_id: str) -> None:
        with self._write() as conn:
            conn.execute(QUERIES["leader_resign"], {"name": name, "worker_id": worker_id})

    def leader_get(self, *, name: str) -> str | None:
        rows = self._fetch("leader_get", {"name": name})
        return str(rows[0]["worker_id"]) if rows else None
