-- jobkeeper schema version 1 (SQLite).
-- Timestamps are REAL seconds since the Unix epoch, UTC by construction
-- ({now} is julianday('now') converted), so no session time zone can shift
-- them. Statements end with ";" at the end of a line: migrate() runs them one
-- by one inside a single BEGIN IMMEDIATE transaction.

CREATE TABLE jobkeeper_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids never reused
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    args             TEXT    NOT NULL DEFAULT '{}',
    status           TEXT    NOT NULL DEFAULT 'available',
    priority         INTEGER NOT NULL DEFAULT 0,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 20,
    scheduled_at     REAL    NOT NULL DEFAULT ({now}),
    created_at       REAL    NOT NULL DEFAULT ({now}),
    attempted_at     REAL,
    finished_at      REAL,
    worker_id        TEXT,
    unique_key       TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]',
    result           TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT jobkeeper_jobs_status_valid CHECK (
        status IN ('scheduled', 'available', 'running', 'retryable', 'completed', 'cancelled')),
    CONSTRAINT jobkeeper_jobs_running_has_holder CHECK ((status = 'running') = (worker_id IS NOT NULL)),
    CONSTRAINT jobkeeper_jobs_attempt_valid CHECK (attempt >= 0 AND max_attempts > 0)
);

-- Only available jobs are in the claim index: its size tracks the backlog,
-- not the history.
CREATE INDEX jobkeeper_jobs_claim_idx
    ON jobkeeper_jobs (queue, priority, scheduled_at, id)
    WHERE status = 'available';

CREATE INDEX jobkeeper_jobs_due_idx
    ON jobkeeper_jobs (scheduled_at)
    WHERE status IN ('scheduled', 'retryable');

CREATE INDEX jobkeeper_jobs_running_idx
    ON jobkeeper_jobs (worker_id)
    WHERE status = 'running';

CREATE INDEX jobkeeper_jobs_finished_idx
    ON jobkeeper_jobs (finished_at)
    WHERE status IN ('completed', 'cancelled');

CREATE UNIQUE INDEX jobkeeper_jobs_unique_idx
    ON jobkeeper_jobs (task, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'available', 'running', 'retryable');

CREATE TABLE jobkeeper_dead_letters (
    id           INTEGER PRIMARY KEY,
    queue        TEXT    NOT NULL,
    task         TEXT    NOT NULL,
    args         TEXT    NOT NULL,
    priority     INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    scheduled_at REAL    NOT NULL,
    created_at   REAL    NOT NULL,
    attempted_at REAL,
    finished_at  REAL    NOT NULL,
    unique_key   TEXT,
    errors       TEXT    NOT NULL,
    result       TEXT,
    reason       TEXT    NOT NULL
);

CREATE INDEX jobkeeper_dead_letters_queue_idx ON jobkeeper_dead_letters (queue, id);

CREATE TABLE jobkeeper_workers (
    id           TEXT    PRIMARY KEY,
    hostname     TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT    NOT NULL,
    started_at   REAL    NOT NULL,
    heartbeat_at REAL    NOT NULL
);
