-- Waiting for results (JobQueue.wait): a waiter marks the job it waits for
-- (awaited), and only marked jobs announce their end. Jobs nobody waits for
-- cost the outcome statements one boolean test per row, and no NOTIFY.
-- ADD COLUMN with a constant default rewrites nothing (PostgreSQL 11+).
ALTER TABLE jobkeeper_jobs ADD COLUMN awaited boolean NOT NULL DEFAULT false;

-- One NOTIFY per awaited job that ends (completed or cancelled in place, or
-- its row deleted: moved to the dead letters, completed with retention=0,
-- pruned), sent by the statement that ends it and delivered at its commit.
-- A trigger rather than a clause in each outcome statement: every way a
-- job can end (worker outcomes, the rescuer, cancel, the pruner) is covered
-- by the same two lines, and the WHEN conditions are tested before any
-- function is called, so rows nobody awaits never enter plpgsql. The payload
-- is the job id only. The channel is per schema, as the insert trigger's:
-- 'jobkeeper_done_' plus the schema, or its md5 past 48 bytes (63 in all).
CREATE FUNCTION jobkeeper_notify_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'jobkeeper_done_' || CASE WHEN octet_length(TG_TABLE_SCHEMA) <= 48
                                  THEN TG_TABLE_SCHEMA ELSE md5(TG_TABLE_SCHEMA) END,
        OLD.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobkeeper_jobs_notify_done_update
    AFTER UPDATE OF status ON jobkeeper_jobs
    FOR EACH ROW
    WHEN (OLD.awaited AND NEW.status IN ('completed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION jobkeeper_notify_done();

CREATE TRIGGER jobkeeper_jobs_notify_done_delete
    AFTER DELETE ON jobkeeper_jobs
    FOR EACH ROW
    WHEN (OLD.awaited)
    EXECUTE FUNCTION jobkeeper_notify_done();
