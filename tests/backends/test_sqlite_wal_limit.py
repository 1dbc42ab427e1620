"""The SQLite WAL file is cut back once checkpoints catch up
(``connection_journal_size_limit``). A break-test held a plain reader open
beside a producer and a worker: the WAL grew to 510 MB, and after the reader
had closed it stayed at 89.6 MB for as long as any process had the database
open (SQLite reuses the file rather than shrink it).
"""

from __future__ import annotations

import os
import sqlite3

from jobkeeper import JobQueue

LIMIT_MIB = 16


def test_a_wal_grown_behind_a_long_reader_is_cut_back_after_it(sqlite_url: str) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    jq = JobQueue(sqlite_url)
    jq.migrate()

    def wal_mib() -> float:
        return os.path.getsize(f"{path}-wal") / (1 << 20)

    def batch() -> None:
        jq.enqueue_many([("anything", {"pad": "x" * 400, "i": i}) for i in range(1000)])

    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM jobkeeper_jobs").fetchone()  # holds a snapshot
        while wal_mib() <= 2 * LIMIT_MIB:
            batch()
        reader.execute("COMMIT")
    finally:
        reader.close()
    grown = wal_mib()
    for _ in range(5):  # a checkpoint catches up, then a write starts the WAL over
        batch()
    try:
        assert wal_mib() <= LIMIT_MIB, f"WAL {grown:.1f} MiB, still {wal_mib():.1f} MiB after"
    finally:
        jq.close()
