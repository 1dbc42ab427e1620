-- Version 10: the crash budget (poison jobs); see the PostgreSQL migration.
ALTER TABLE jobkeeper_jobs ADD COLUMN run_alone INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobkeeper_jobs ADD COLUMN alone_fence INTEGER;
ALTER TABLE jobkeeper_jobs ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0
    CONSTRAINT jobkeeper_jobs_crashes_valid CHECK (crashes >= 0);
ALTER TABLE jobkeeper_dead_letters ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
