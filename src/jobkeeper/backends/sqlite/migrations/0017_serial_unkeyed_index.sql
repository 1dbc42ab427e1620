-- Version 17: an index of the unkeyed jobs of serial queues, so that a
-- serial claim finds the unkeyed jobs it may take without reading past the
-- keyed jobs ahead of them (see the PostgreSQL migration of the same
-- number). serial_unkeyed is 1 on a job without a serial key whose queue
-- was serial when the job was written or when the queue became serial, NULL
-- otherwise. Every write holds the database's write lock, so here only a
-- job written by a jobkeeper of version 16 (a rolling deploy) can miss its
-- flag; it is still taken when a walk of the queue's head reaches it.
ALTER TABLE jobkeeper_jobs ADD COLUMN serial_unkeyed INTEGER;

CREATE INDEX jobkeeper_jobs_serial_unkeyed_idx
    ON jobkeeper_jobs (queue, priority, scheduled_at, id)
    WHERE status = 'available' AND serial_unkeyed = 1;

UPDATE jobkeeper_jobs SET serial_unkeyed = 1
WHERE serial_key IS NULL
  AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
  AND queue IN (SELECT name FROM jobkeeper_queues WHERE serial);
