-- Version 8: the enqueuer's trace context (see the PostgreSQL migration).
ALTER TABLE jobkeeper_jobs ADD COLUMN trace_context TEXT;
