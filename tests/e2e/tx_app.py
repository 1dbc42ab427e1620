"""The app of the complete_in tests' worker subprocesses:

    python -m jobkeeper --database URL worker --app tests.e2e.tx_app:jq

Its task writes a row to its own table (``effects``) and completes its job
in the same transaction with ``complete_in``. Each step is noted in the
``record`` file, one line ``<job id> <attempt> <fence> <pid> <event> <key>``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

import psycopg

from jobkeeper import ClaimLost, JobQueue, complete_in, current_job

SETTINGS: dict[str, Any] = json.loads(os.environ.get("JK_E2E_SETTINGS", "{}"))
jq = JobQueue(os.environ.get("JK_E2E_DATABASE", "sqlite:///unused-e2e.db"), **SETTINGS)

EFFECTS_DDL = "CREATE TABLE effects (job_id bigint, attempt int, fence bigint, pid int)"


def note(record: str, event: str) -> None:
    here = current_job()
    key = getattr(here, "idempotency_key", "")
    line = f"{here.id} {here.attempt} {here.fence} {os.getpid()} {event} {key}\n".encode()
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def connect(url: str) -> Any:
    if url.startswith("postgres"):
        return psycopg.connect(url)
    return sqlite3.connect(url.removeprefix("sqlite:///"), timeout=60)


def wait_gate(gate: str | None, attempt: int, record: str) -> None:
    """Wait for the file ``<gate>-<attempt>``. Code that ignores interrupts
    (as C code would): an interrupt (the worker learnt its claim was lost)
    is noted and the wait goes on, so the test decides when it proceeds.
    """
    while gate is not None and not os.path.exists(f"{gate}-{attempt}"):
        try:
            time.sleep(0.02)
        except BaseException:  # TaskInterrupted, deliberately ignored
            note(record, "interrupted")


@jq.task(max_attempts=5)
def pay(
    url: str,
    record: str,
    gate: str | None = None,
    hold: float = 0.0,
    rollback_attempts: int = 0,
    raise_after_commit: bool = False,
    rollback_then_return: bool = False,
) -> dict[str, Any]:
    """Insert one effects row and complete the job in that transaction.

    Args:
        gate: wait for ``<gate>-<attempt>`` before the transaction begins.
        hold: seconds to sleep inside the transaction, after its write (on
            SQLite: holding the database's write lock).
        rollback_attempts: attempts up to this one roll back after
            complete_in and raise (a later error in the caller's code).
        raise_after_commit: raise after the commit.
        rollback_then_return: roll back after complete_in and return.
    """
    job = current_job()
    note(record, "waiting")
    wait_gate(gate, job.attempt, record)
    conn = connect(url)
    try:
        conn.execute(
            "INSERT INTO effects (job_id, attempt, fence, pid) VALUES (%s, %s, %s, %s)"
            if url.startswith("postgres")
            else "INSERT INTO effects (job_id, attempt, fence, pid) VALUES (?, ?, ?, ?)",
            (job.id, job.attempt, job.fence, os.getpid()),
        )
        if hold:
            time.sleep(hold)
        try:
            complete_in(conn, {"by": os.getpid(), "attempt": job.attempt})
        except ClaimLost:
            conn.rollback()
            note(record, "claim_lost")
            raise
        if job.attempt <= rollback_attempts:
            conn.rollback()
            note(record, "rolled_back")
            raise RuntimeError(f"failed after complete_in in attempt {job.attempt}")
        if rollback_then_return:
            conn.rollback()
            note(record, "rolled_back")
            return {"returned": "after a rollback"}
        conn.commit()
        note(record, "committed")
    finally:
        conn.close()
    if raise_after_commit:
        raise RuntimeError("raised after the commit")
    return {"returned": True}


@jq.task(max_attempts=5)
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"
