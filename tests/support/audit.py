"""Every change of a job row, recorded by a trigger in ``test_job_audit``
(the case's "audit trigger"), so a test reads the whole history of each job
in commit order instead of sampling it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .db import Target, is_pg, sql


@dataclass(frozen=True)
class Change:
    """One update (or delete: ``new_status`` "deleted") of a job row. Times in
    Unix seconds by the database clock; ``errors`` is the length of the list."""

    seq: int
    job_id: int
    old_status: str
    new_status: str
    attempt: int
    worker_id: str | None
    errors: int
    at: float
    scheduled_at: float


def install_job_audit(target: Target) -> None:
    """Record every UPDATE and DELETE of ``jobkeeper_jobs`` in ``test_job_audit``."""
    if is_pg(target):
        sql(
            target,
            """
            CREATE TABLE test_job_audit (
                seq bigserial PRIMARY KEY, job_id bigint, old_status text, new_status text,
                attempt int, worker_id text, errors int, at timestamptz, scheduled_at timestamptz);
            CREATE FUNCTION test_audit_job() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'DELETE' THEN
                    INSERT INTO test_job_audit
                        (job_id, old_status, new_status, attempt, worker_id, errors, at,
                         scheduled_at)
                    VALUES (OLD.id, OLD.status, 'deleted', OLD.attempt, OLD.worker_id,
                            jsonb_array_length(OLD.errors), now(), OLD.scheduled_at);
                    RETURN OLD;
                END IF;
                INSERT INTO test_job_audit
                    (job_id, old_status, new_status, attempt, worker_id, errors, at, scheduled_at)
                VALUES (NEW.id, OLD.status, NEW.status, NEW.attempt, NEW.worker_id,
                        jsonb_array_length(NEW.errors), now(), NEW.scheduled_at);
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_audit_job AFTER UPDATE OR DELETE ON jobkeeper_jobs
                FOR EACH ROW EXECUTE FUNCTION test_audit_job();
            """,
        )
        return
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    sql(
        target,
        "CREATE TABLE test_job_audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER, "
        "old_status TEXT, new_status TEXT, attempt INTEGER, worker_id TEXT, errors INTEGER, "
        "at REAL, scheduled_at REAL)",
    )
    sql(
        target,
        "CREATE TRIGGER test_audit_job_update AFTER UPDATE ON jobkeeper_jobs BEGIN "
        "INSERT INTO test_job_audit (job_id, old_status, new_status, attempt, worker_id, "
        "errors, at, scheduled_at) VALUES (NEW.id, OLD.status, NEW.status, NEW.attempt, "
        f"NEW.worker_id, json_array_length(NEW.errors), {now}, NEW.scheduled_at); END",
    )
    sql(
        target,
        "CREATE TRIGGER test_audit_job_delete AFTER DELETE ON jobkeeper_jobs BEGIN "
        "INSERT INTO test_job_audit (job_id, old_status, new_status, attempt, worker_id, "
        "errors, at, scheduled_at) VALUES (OLD.id, OLD.status, 'deleted', OLD.attempt, "
        f"OLD.worker_id, json_array_length(OLD.errors), {now}, OLD.scheduled_at); END",
    )


def job_audit(target: Target) -> dict[int, list[Change]]:
    """Every change recorded, per job id, in commit order."""
    epoch = "extract(epoch FROM {})::float8" if is_pg(target) else "{}"
    rows = sql(
        target,
        "SELECT seq, job_id, old_status, new_status, attempt, worker_id, errors, "
        f"{epoch.format('at')}, {epoch.format('scheduled_at')} FROM test_job_audit ORDER BY seq",
    )
    out: dict[int, list[Change]] = {}
    for row in rows:
        change = Change(
            int(row[0]),
            int(row[1]),
            str(row[2]),
            str(row[3]),
            int(row[4]),
            None if row[5] is None else str(row[5]),
            int(row[6]),
            float(row[7]),
            float(row[8]),
        )
        out.setdefault(change.job_id, []).append(change)
    return out
