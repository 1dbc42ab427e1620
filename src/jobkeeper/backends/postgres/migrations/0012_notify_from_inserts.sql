-- Version 12: the statements that insert jobs announce them themselves
-- (pg_notify on the same channel, one per queue of available jobs, in the
-- insert's transaction); the insert trigger of version 1 is dropped.
-- The trigger's machinery (the AFTER trigger queue, the transition table, a
-- PL/pgSQL call running its query) cost about 50 us of a single enqueue's
-- 450 us on the server, a ninth, and 0.4 ms of a 1,000-row COPY's 6.8 ms; a
-- pg_notify in the statement costs a few (benchmarks and the measurement in
-- the commit that added this migration).
-- Rolling deploy: enqueuers of version 11 (the code before this one) insert
-- without announcing once this has run: their jobs are claimed at the next
-- poll (poll_interval, 1 s by default) instead of at once; nothing is lost.
-- Code of this version against a schema of version 11 announces twice in one
-- transaction, which PostgreSQL delivers once (identical NOTIFYs of a
-- transaction are folded).
DROP TRIGGER IF EXISTS jobkeeper_jobs_notify_insert ON jobkeeper_jobs;
DROP FUNCTION IF EXISTS jobkeeper_notify_insert();
