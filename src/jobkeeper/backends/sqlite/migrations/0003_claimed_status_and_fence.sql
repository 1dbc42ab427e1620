-- Version 3: a job a worker holds but has not started is 'claimed' (prefetch);
-- 'running' means started. A claimed job can go back without spending its
-- attempt, so the attempt no longer names a claim: every claim bumps
-- 'fence', and every write of a holder is fenced on it. unstarted_returns
-- counts claims lost before the job started whose attempt was given back
-- (the rescuer bounds them).
-- SQLite cannot alter a CHECK constraint: the table is rebuilt (create the
-- new one, copy, drop, rename, recreate the indexes), inside migrate()'s one
-- BEGIN IMMEDIATE transaction. Statements end with ";" at the end of a line.

CREATE TABLE jobkeeper_jobs_v3 (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids never reused
    queue             TEXT    NOT NULL,
    task              TEXT    NOT NULL,
    args              TEXT    NOT NULL DEFAULT '{}',
    status            TEXT    NOT NULL DEFAULT 'available',
    priority          INTEGER NOT NULL DEFAULT 0,
    attempt           INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL DEFAULT 20,
    scheduled_at      REAL    NOT NULL DEFAULT ({now}),
    created_at        REAL    NOT NULL DEFAULT ({now}),
    attempted_at      REAL,
    finished_at       REAL,
    worker_id         TEXT,
    unique_key        TEXT,
    errors            TEXT    NOT NULL DEFAULT '[]',
    result            TEXT,
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    fence             INTEGER NOT NULL DEFAULT 0,
    unstarted_returns INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT jobkeeper_jobs_status_valid CHECK (
        status IN ('scheduled', 'available', 'claimed', 'running', 'retryable', 'completed',
                   'cancelled')),
    CONSTRAINT jobkeeper_jobs_held_has_holder
        CHECK ((status IN ('claimed', 'running')) = (worker_id IS NOT NULL)),
    CONSTRAINT jobkeeper_jobs_attempt_valid CHECK (attempt >= 0 AND max_attempts > 0)
);

INSERT INTO jobkeeper_jobs_v3
    (id, queue, task, args, status, priority, attempt, max_attempts, scheduled_at, created_at,
     attempted_at, finished_at, worker_id, unique_key, errors, result, cancel_requested)
SELECT id, queue, task, args, status, priority, attempt, max_attempts, scheduled_at, created_at,
       attempted_at, finished_at, worker_id, unique_key, errors, result, cancel_requested
FROM jobkeeper_jobs;

-- Ids are never reused: the new table continues the old one's sequence,
-- which may be past its largest id (pruned jobs, dead letters).
DELETE FROM sqlite_sequence WHERE name = 'jobkeeper_jobs_v3';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'jobkeeper_jobs_v3', seq FROM sqlite_sequence WHERE name = 'jobkeeper_jobs';

DROP TABLE jobkeeper_jobs;
ALTER TABLE jobkeeper_jobs_v3 RENAME TO jobkeeper_jobs;

CREATE INDEX jobkeeper_jobs_claim_idx
    ON jobkeeper_jobs (queue, priority, scheduled_at, id)
    WHERE status = 'available';

CREATE INDEX jobkeeper_jobs_due_idx
    ON jobkeeper_jobs (scheduled_at)
    WHERE status IN ('scheduled', 'retryable');

CREATE INDEX jobkeeper_jobs_held_idx
    ON jobkeeper_jobs (worker_id)
    WHERE status IN ('claimed', 'running');

CREATE INDEX jobkeeper_jobs_finished_idx
    ON jobkeeper_jobs (finished_at)
    WHERE status IN ('completed', 'cancelled');

CREATE UNIQUE INDEX jobkeeper_jobs_unique_idx
    ON jobkeeper_jobs (task, unique_key)
    WHERE unique_key IS NOT NULL
      AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable');
