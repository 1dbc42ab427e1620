-- The PostgreSQL schema's awaited flag, kept for one schema across backends.
-- SQLite has no NOTIFY: waiters of a process share one connection that
-- watches PRAGMA data_version and re-reads the awaited jobs when another
-- connection commits, so nothing sets this flag here.
ALTER TABLE jobkeeper_jobs ADD COLUMN awaited INTEGER NOT NULL DEFAULT 0;
