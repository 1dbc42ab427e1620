-- Version 3: a job a worker holds but has not started is 'claimed' (prefetch);
-- 'running' means started. A claimed job can go back without spending its
-- attempt, so the attempt no longer names a claim: every claim bumps
-- 'fence', and every write of a holder is fenced on it.
ALTER TABLE jobkeeper_jobs ADD COLUMN fence bigint NOT NULL DEFAULT 0;
-- Claims lost before the job started whose attempt was given back; the
-- rescuer bounds them, so a job that kills its worker as it starts still
-- spends its attempts.
ALTER TABLE jobkeeper_jobs ADD COLUMN unstarted_returns integer NOT NULL DEFAULT 0;

ALTER TABLE jobkeeper_jobs DROP CONSTRAINT jobkeeper_jobs_status_valid;
ALTER TABLE jobkeeper_jobs ADD CONSTRAINT jobkeeper_jobs_status_valid CHECK (
    status IN ('scheduled', 'available', 'claimed', 'running', 'retryable', 'completed',
               'cancelled'));
-- Exactly the held jobs have a holder: the fence every ack relies on.
ALTER TABLE jobkeeper_jobs DROP CONSTRAINT jobkeeper_jobs_running_has_holder;
ALTER TABLE jobkeeper_jobs ADD CONSTRAINT jobkeeper_jobs_held_has_holder
    CHECK ((status IN ('claimed', 'running')) = (worker_id IS NOT NULL));

-- The rescuer's, the cancel poll's and job_held_by's lookups of held jobs.
DROP INDEX jobkeeper_jobs_running_idx;
CREATE INDEX jobkeeper_jobs_held_idx
    ON jobkeeper_jobs (worker_id)
    WHERE status IN ('claimed', 'running');

-- unique_key: at most one pending job per (task, key); claimed is pending.
DROP INDEX jobkeeper_jobs_unique_idx;
CREATE UNIQUE INDEX jobkeeper_jobs_unique_idx
    ON jobkeeper_jobs (task, unique_key)
    WHERE unique_key IS NOT NULL
      AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable');
