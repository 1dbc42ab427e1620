-- Periodic jobs: one row per periodic name, written by every worker whose
-- app registers it; the tick record is advanced in the same transaction as
-- the job's insert (see the PostgreSQL migration for the reasons).
CREATE TABLE jobkeeper_periodic (
    name         TEXT    PRIMARY KEY,
    schedule     TEXT    NOT NULL,
    timezone     TEXT    NOT NULL,
    task         TEXT    NOT NULL,
    queue        TEXT    NOT NULL,
    priority     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL CHECK (max_attempts > 0),
    args         TEXT    NOT NULL,
    catch_up     REAL    NOT NULL CHECK (catch_up >= 0),
    since_at     REAL    NOT NULL,
    last_tick_at REAL,
    next_tick_at REAL,
    seen_at      REAL    NOT NULL,
    created_at   REAL    NOT NULL,
    updated_at   REAL    NOT NULL
);
