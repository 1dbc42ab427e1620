-- Version 13: the serial claim finds each key's first due job through an
-- index in that order, instead of comparing every available job of a key
-- with every other. With 22,000 jobs, one in ten keyed over 50 keys, each
-- claim of 100 spent about 60 ms hash-joining the 2,200 keyed jobs against
-- themselves ("is an earlier job of the key due?") and 14 ms more in the
-- claim itself, and two burst workers took 28 s to drain what they drain in
-- 1.7 s without keys (measured in the commit that added this migration).
-- The index holds only available keyed jobs, so it stays small; building it
-- reads the whole table once, under a lock that holds enqueues back for as
-- long (seconds for millions of rows).
-- Same function signature and result: a worker of version 12 calls the new
-- body unchanged during a rolling deploy, and the old body (run by a schema
-- of version 12) answers the same, only slower.
CREATE INDEX jobkeeper_jobs_serial_first_idx
    ON jobkeeper_jobs (serial_key, queue, priority, scheduled_at, id)
    WHERE status = 'available' AND serial_key IS NOT NULL;

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
                  AND (job.serial_key IS NULL OR (
                        job.id = (
                            SELECT first.id FROM jobkeeper_jobs AS first
                            WHERE first.serial_key = job.serial_key AND first.queue = p_queue
                              AND first.status = 'available'
                            ORDER BY first.priority, first.scheduled_at, first.id
                            LIMIT 1)
                        AND NOT EXISTS (
                            SELECT 1 FROM jobkeeper_jobs AS holder
                            WHERE holder.serial_key = job.serial_key
                              AND holder.status IN ('claimed', 'running'))))
                ORDER BY job.priority, job.scheduled_at, job.id
                LIMIT allowed) AS found
            WHERE found.serial_key IS NOT NULL
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
                    AND job.id = (
                        SELECT first.id FROM jobkeeper_jobs AS first
                        WHERE first.serial_key = job.serial_key AND first.queue = p_queue
                          AND first.status = 'available'
                        ORDER BY first.priority, first.scheduled_at, first.id
                        LIMIT 1)
                    AND NOT EXISTS (
                        SELECT 1 FROM jobkeeper_jobs AS holder
                        WHERE holder.serial_key = job.serial_key
                          AND holder.status IN ('claimed', 'running'))))
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
