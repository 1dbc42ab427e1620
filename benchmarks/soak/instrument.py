"""Soak-only instrumentation of a jobkeeper database, and reading it back.

Two audit tables, filled by triggers (so they record what the database
actually committed, on the database clock):

- ``soak_heartbeats(worker_id, at)``: every heartbeat (and registration);
- ``soak_acks(job_id, new_status, worker_id, attempt, fence, at)``: every
  write that took a job out of ``claimed``/``running``, with the claim it was
  fenced on.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import psycopg

from benchmarks.soak.history import Ack, Row, parse_db_time

PG_INSTRUMENT = """
CREATE TABLE IF NOT EXISTS soak_heartbeats (worker_id text NOT NULL, at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS soak_acks (
    job_id bigint NOT NULL, new_status text NOT NULL, worker_id text, attempt integer,
    fence bigint, at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION soak_record_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO soak_heartbeats VALUES (NEW.id, NEW.heartbeat_at);
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION soak_record_ack() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO soak_acks
            VALUES (OLD.id, 'removed', OLD.worker_id, OLD.attempt, OLD.fence, now());
    ELSE
        INSERT INTO soak_acks
            VALUES (NEW.id, NEW.status, OLD.worker_id, OLD.attempt, OLD.fence, now());
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS soak_heartbeats ON jobkeeper_workers;
CREATE TRIGGER soak_heartbeats AFTER INSERT OR UPDATE OF heartbeat_at ON jobkeeper_workers
    FOR EACH ROW EXECUTE FUNCTION soak_record_heartbeat();
DROP TRIGGER IF EXISTS soak_acks_update ON jobkeeper_jobs;
CREATE TRIGGER soak_acks_update AFTER UPDATE ON jobkeeper_jobs
    FOR EACH ROW WHEN (OLD.status IN ('claimed', 'running')
                       AND NEW.status NOT IN ('claimed', 'running'))
    EXECUTE FUNCTION soak_record_ack();
DROP TRIGGER IF EXISTS soak_acks_delete ON jobkeeper_jobs;
CREATE TRIGGER soak_acks_delete AFTER DELETE ON jobkeeper_jobs
    FOR EACH ROW WHEN (OLD.status IN ('claimed', 'running'))
    EXECUTE FUNCTION soak_record_ack();
"""

_SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
SQLITE_INSTRUMENT = f"""
CREATE TABLE IF NOT EXISTS soak_heartbeats (worker_id TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS soak_acks (
    job_id INTEGER NOT NULL, new_status TEXT NOT NULL, worker_id TEXT, attempt INTEGER,
    fence INTEGER, at REAL NOT NULL);
CREATE TRIGGER IF NOT EXISTS soak_heartbeats_insert AFTER INSERT ON jobkeeper_workers
BEGIN INSERT INTO soak_heartbeats VALUES (NEW.id, NEW.heartbeat_at); END;
CREATE TRIGGER IF NOT EXISTS soak_heartbeats_update AFTER UPDATE OF heartbeat_at
    ON jobkeeper_workers
BEGIN INSERT INTO soak_heartbeats VALUES (NEW.id, NEW.heartbeat_at); END;
CREATE TRIGGER IF NOT EXISTS soak_acks_update AFTER UPDATE ON jobkeeper_jobs
    WHEN OLD.status IN ('claimed', 'running') AND NEW.status NOT IN ('claimed', 'running')
BEGIN INSERT INTO soak_acks
    VALUES (NEW.id, NEW.status, OLD.worker_id, OLD.attempt, OLD.fence, {_SQLITE_NOW});
END;
CREATE TRIGGER IF NOT EXISTS soak_acks_delete AFTER DELETE ON jobkeeper_jobs
    WHEN OLD.status IN ('claimed', 'running')
BEGIN INSERT INTO soak_acks
    VALUES (OLD.id, 'removed', OLD.worker_id, OLD.attempt, OLD.fence, {_SQLITE_NOW});
END;
"""

_JOB_COLUMNS = (
    "id, status, attempt, max_attempts, args, result, errors, finished_at, worker_id, "
    "queue, serial_key, fence"
)
_DEAD_COLUMNS = (
    "id, 'dead', attempt, max_attempts, args, result, errors, finished_at, NULL, queue, "
    "serial_key, fence"
)


def _sqlite_path(url: str) -> str:
    return url.split("://", 1)[1][1:].split("?", 1)[0]


def install(url: str) -> None:
    """Create the audit tables and triggers (after ``migrate``)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(_sqlite_path(url), timeout=30, isolation_level=None)
        try:
            conn.executescript(SQLITE_INSTRUMENT)
        finally:
            conn.close()
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PG_INSTRUMENT)


def _json(value: Any, decode: bool) -> Any:
    if decode and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _row(values: tuple[Any, ...], decode: bool) -> Row:
    """One row; ``decode``: JSON columns are text (SQLite), not decoded jsonb."""
    (
        job_id,
        status,
        attempt,
        max_attempts,
        args,
        result,
        errors,
        finished_at,
        worker_id,
        queue,
        serial_key,
        fence,
    ) = values
    args = _json(args, decode)
    token = args.get("n") if isinstance(args, dict) else None
    errors = _json(errors, decode)
    return Row(
        id=int(job_id),
        status=str(status),
        attempt=int(attempt),
        max_attempts=int(max_attempts),
        token=token if isinstance(token, int) else None,
        result=_json(result, decode),
        errors=errors if isinstance(errors, list) else [],
        finished_at=parse_db_time(finished_at),
        worker_id=worker_id,
        queue=queue,
        serial_key=serial_key,
        fence=None if fence is None else int(fence),
    )


def read_state(url: str) -> tuple[list[Row], dict[str, list[float]], list[Ack]]:
    """The final tables: job rows (live and dead), heartbeats, acks."""
    queries = (
        f"SELECT {_JOB_COLUMNS} FROM jobkeeper_jobs",
        f"SELECT {_DEAD_COLUMNS} FROM jobkeeper_dead_letters",
        "SELECT worker_id, at FROM soak_heartbeats",
        "SELECT job_id, new_status, worker_id, attempt, fence, at FROM soak_acks",
    )
    decode = url.startswith("sqlite")
    if decode:
        conn = sqlite3.connect(_sqlite_path(url), timeout=30, isolation_level=None)
        try:
            results = [conn.execute(q).fetchall() for q in queries]
        finally:
            conn.close()
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            results = [pg.execute(q).fetchall() for q in queries]  # type: ignore[arg-type]
    jobs, dead, beats, acks = results
    rows = [_row(r, decode) for r in jobs] + [_row(r, decode) for r in dead]
    heartbeats: dict[str, list[float]] = {}
    for worker, at in beats:
        heartbeats.setdefault(worker, []).append(parse_db_time(at) or 0.0)
    ack_list = [
        Ack(
            int(job),
            str(status),
            str(worker),
            int(attempt),
            parse_db_time(at) or 0.0,
            fence=None if fence is None else int(fence),
        )
        for job, status, worker, attempt, fence, at in acks
    ]
    return rows, heartbeats, ack_list
