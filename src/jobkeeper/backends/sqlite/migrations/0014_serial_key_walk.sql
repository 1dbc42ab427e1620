-- Version 14: the index of available keyed jobs leads with the queue
-- (jobkeeper_jobs_serial_queue_idx replaces jobkeeper_jobs_serial_first_idx), so
-- that the serial claim's walk over a queue's keys steps over no other
-- queue's keys (see the PostgreSQL migration of the same number). It answers
-- "a key's first job in a queue" as before, so code of version 13 claims
-- unchanged beside it. Rebuilding it reads the whole table.
CREATE INDEX jobkeeper_jobs_serial_queue_idx
    ON jobkeeper_jobs (queue, serial_key, priority, scheduled_at, id)
    WHERE status = 'available' AND serial_key IS NOT NULL;
DROP INDEX jobkeeper_jobs_serial_first_idx;
