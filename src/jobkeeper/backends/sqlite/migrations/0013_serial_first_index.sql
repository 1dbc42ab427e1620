-- Version 13: each key's first due job in a queue, found through an index in
-- that order (job_claim_serial), instead of comparing every available job of
-- a key with every other (see the PostgreSQL migration of the same number).
-- Only available keyed jobs are in it. Code of version 12 claims unchanged
-- beside it.
CREATE INDEX jobkeeper_jobs_serial_first_idx
    ON jobkeeper_jobs (serial_key, queue, priority, scheduled_at, id)
    WHERE status = 'available' AND serial_key IS NOT NULL;
