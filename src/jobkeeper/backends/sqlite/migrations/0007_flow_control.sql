-- Version 7: flow control across the fleet (see the PostgreSQL migration).
-- SQLite claims inside BEGIN IMMEDIATE, so the counts a limit is checked
-- against cannot change during a claim: no lock rows or functions needed.
CREATE TABLE jobkeeper_queues (
    name        TEXT    PRIMARY KEY,
    paused      INTEGER NOT NULL DEFAULT 0,
    concurrency INTEGER CHECK (concurrency >= 1),
    rate_limit  INTEGER CHECK (rate_limit >= 1),
    rate_period REAL    CHECK (rate_period > 0),
    max_pending INTEGER CHECK (max_pending >= 0),
    serial      INTEGER NOT NULL DEFAULT 0,
    updated_at  REAL    NOT NULL DEFAULT ({now}),
    CONSTRAINT jobkeeper_queues_rate_whole CHECK ((rate_limit IS NULL) = (rate_period IS NULL))
);

-- Claim times of rate-limited queues, one row per claim batch, pruned past the period.
CREATE TABLE jobkeeper_queue_starts (
    queue      TEXT    NOT NULL,
    started_at REAL    NOT NULL,
    jobs       INTEGER NOT NULL CHECK (jobs > 0)
);
CREATE INDEX jobkeeper_queue_starts_idx ON jobkeeper_queue_starts (queue, started_at);

ALTER TABLE jobkeeper_jobs ADD COLUMN serial_key TEXT;
ALTER TABLE jobkeeper_dead_letters ADD COLUMN serial_key TEXT;
CREATE INDEX jobkeeper_jobs_serial_idx
    ON jobkeeper_jobs (serial_key, status)
    WHERE serial_key IS NOT NULL;

ALTER TABLE jobkeeper_workers ADD COLUMN version TEXT;
