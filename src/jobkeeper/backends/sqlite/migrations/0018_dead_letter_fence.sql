-- Version 18: a dead letter keeps its job's fence, and a requeue gives the
-- job back greatest(fence, attempt, entries in errors) instead of 0 (see the
-- PostgreSQL migration of the same number).
ALTER TABLE jobkeeper_dead_letters ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
