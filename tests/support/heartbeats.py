"""Every heartbeat a worker writes, recorded by a trigger, so heartbeat gaps
are measured exactly (on the database's clock), not by sampling.
"""

from __future__ import annotations

from .db import Target, is_pg, sql


def install_heartbeat_log(target: Target) -> None:
    """Record every write of a worker's ``heartbeat_at`` in ``test_heartbeat_log``."""
    if is_pg(target):
        sql(
            target,
            """
            CREATE TABLE test_heartbeat_log (worker_id text, at timestamptz);
            CREATE FUNCTION test_log_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO test_heartbeat_log VALUES (NEW.id, NEW.heartbeat_at);
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_log_heartbeat AFTER INSERT OR UPDATE ON jobkeeper_workers
                FOR EACH ROW EXECUTE FUNCTION test_log_heartbeat();
            """,
        )
        return
    sql(target, "CREATE TABLE test_heartbeat_log (worker_id TEXT, at REAL)")
    for event in ("INSERT", "UPDATE"):
        sql(
            target,
            f"CREATE TRIGGER test_log_heartbeat_{event.lower()} AFTER {event} "
            "ON jobkeeper_workers BEGIN "
            "INSERT INTO test_heartbeat_log VALUES (NEW.id, NEW.heartbeat_at); END",
        )


def heartbeat_log(target: Target) -> dict[str, list[float]]:
    """Every heartbeat logged, per worker id, as sorted Unix seconds."""
    at = "extract(epoch FROM at)::float8" if is_pg(target) else "at"
    out: dict[str, list[float]] = {}
    for worker_id, when in sql(target, f"SELECT worker_id, {at} FROM test_heartbeat_log"):
        out.setdefault(str(worker_id), []).append(float(when))
    return {worker_id: sorted(times) for worker_id, times in out.items()}
