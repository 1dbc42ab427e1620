-- Waiting for results (JobQueue.wait): a waiter marks the job it waits for
-- (awaited), and only marked jobs announce their end: the statements that end
-- a job return the flag, and the backend sends the NOTIFY (notify_done) for
-- the marked ones. Not a row trigger: with one, the no-op drain ran a
-- quarter slower although its condition was false for every row.
-- ADD COLUMN with a constant default rewrites nothing (PostgreSQL 11+).
ALTER TABLE jobkeeper_jobs ADD COLUMN awaited boolean NOT NULL DEFAULT false;
