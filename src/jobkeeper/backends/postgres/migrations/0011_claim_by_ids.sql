-- jobkeeper schema version 11 (PostgreSQL): the limited claim updates its
-- candidates through the primary key whatever plan it runs on.
-- PL/pgSQL caches the plans of its statements, and after five calls may keep
-- a generic one, which cannot know LIMIT allowed: it took a tenth of the
-- table and hash-joined every row of it to update the few claimed (as the
-- unlimited claim's prepared statement did, see job_claim). The ids now go to
-- the UPDATE as an array, probed through the primary key. Same signature and
-- result: a worker of version 10 calls it unchanged during a rolling deploy.

CREATE OR REPLACE FUNCTION jobkeeper_claim_limited(p_queue text, p_worker_id text, p_limit integer)
RETURNS SETOF jobkeeper_jobs
LANGUAGE plpgsql AS $$
DECLARE
    settings jobkeeper_queues%ROWTYPE;
    allowed  integer := p_limit;
    held     integer;
    started  bigint;
    claim_at timestamptz;
    claimed  integer;
    keys     text[];
BEGIN
    SELECT * INTO settings FROM jobkeeper_queues WHERE name = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        settings.paused := false;
        settings.serial := false;
    END IF;
    IF settings.paused OR allowed <= 0 THEN
        RETURN;
    END IF;
    IF settings.concurrency IS NOT NULL THEN
        -- Held rows of the queue: a crashed holder's rows count until they
        -- are rescued, and stop counting then (no leaked capacity).
        SELECT count(*) INTO held FROM jobkeeper_jobs
        WHERE queue = p_queue AND status IN ('claimed', 'running');
        allowed := least(allowed, settings.concurrency - held);
    END IF;
    claim_at := clock_timestamp();
    IF settings.rate_limit IS NOT NULL THEN
        DELETE FROM jobkeeper_queue_starts
        WHERE queue = p_queue
          AND started_at <= claim_at - make_interval(secs => settings.rate_period);
        SELECT coalesce(sum(jobs), 0) INTO started FROM jobkeeper_queue_starts
        WHERE queue = p_queue;
        allowed := least(allowed, settings.rate_limit - started);
    END IF;
    IF allowed <= 0 THEN
        RETURN;
    END IF;
    IF settings.serial THEN
        -- A key may also have jobs in other queues, claimed under other
        -- queue locks: take each candidate key's advisory lock (in key
        -- order, so two claims never wait on each other in a cycle), then
        -- check "not held" in a later statement, with a fresh snapshot.
        -- The keys of the jobs the claim below would take, as this
        -- snapshot sees it (the same conditions, without row locks).
        keys := ARRAY(
            SELECT DISTINCT found.serial_key FROM (
                SELECT job.serial_key FROM jobkeeper_jobs AS job
                WHERE job.status = 'available' AND job.queue = p_queue
                  AND job.serial_key IS NOT NULL
                  AND NOT EXISTS (
                        SELECT 1 FROM jobkeeper_jobs AS holder
                        WHERE holder.serial_key = job.serial_key
                          AND holder.status IN ('claimed', 'running'))
                  AND NOT EXISTS (
                        SELECT 1 FROM jobkeeper_jobs AS earlier
                        WHERE earlier.serial_key = job.serial_key
                          AND earlier.status = 'available' AND earlier.queue = p_queue
                          AND (earlier.priority, earlier.scheduled_at, earlier.id)
                              < (job.priority, job.scheduled_at, job.id))
                ORDER BY job.priority, job.scheduled_at, job.id
                LIMIT allowed) AS found
            ORDER BY 1);
        PERFORM pg_advisory_xact_lock(hashtextextended('jobkeeper_serial:' || key, 0))
        FROM unnest(keys) AS key;
        -- A keyed job may be taken only while it is its key's first due
        -- job in the queue (priority, scheduled_at, id) and no job of the
        -- key is held anywhere. A first job locked by another session is
        -- skipped, and then its key waits: its second job is not first.
        RETURN QUERY
        WITH candidates AS MATERIALIZED (
            SELECT job.id FROM jobkeeper_jobs AS job
            WHERE job.status = 'available' AND job.queue = p_queue
              AND (job.serial_key IS NULL OR (
                    job.serial_key = ANY(keys)
                    AND NOT EXISTS (
                        SELECT 1 FROM jobkeeper_jobs AS holder
                        WHERE holder.serial_key = job.serial_key
                          AND holder.status IN ('claimed', 'running'))
                    AND NOT EXISTS (
                        SELECT 1 FROM jobkeeper_jobs AS earlier
                        WHERE earlier.serial_key = job.serial_key
                          AND earlier.status = 'available' AND earlier.queue = p_queue
                          AND (earlier.priority, earlier.scheduled_at, earlier.id)
                              < (job.priority, job.scheduled_at, job.id))))
            ORDER BY job.priority, job.scheduled_at, job.id
            LIMIT allowed
            FOR UPDATE OF job SKIP LOCKED
        )
        UPDATE jobkeeper_jobs AS job
        SET status = 'claimed', attempt = job.attempt + 1, fence = job.fence + 1,
            attempted_at = now(), finished_at = NULL, worker_id = p_worker_id
        WHERE job.id = ANY(ARRAY(SELECT id FROM candidates))
        RETURNING job.*;
    ELSE
        RETURN QUERY
        WITH candidates AS MATERIALIZED (
            SELECT id FROM jobkeeper_jobs
            WHERE status = 'available' AND queue = p_queue
            ORDER BY priority, scheduled_at, id
            LIMIT allowed
            FOR UPDATE SKIP LOCKED
        )
        UPDATE jobkeeper_jobs AS job
        SET status = 'claimed', attempt = job.attempt + 1, fence = job.fence + 1,
            attempted_at = now(), finished_at = NULL, worker_id = p_worker_id
        WHERE job.id = ANY(ARRAY(SELECT id FROM candidates))
        RETURNING job.*;
    END IF;
    GET DIAGNOSTICS claimed = ROW_COUNT;
    IF settings.rate_limit IS NOT NULL AND claimed > 0 THEN
        INSERT INTO jobkeeper_queue_starts (queue, started_at, jobs)
        VALUES (p_queue, claim_at, claimed);
    END IF;
END
$$;
