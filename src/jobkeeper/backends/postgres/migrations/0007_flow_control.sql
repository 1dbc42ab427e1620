-- Version 7: flow control across the fleet. Per-queue settings every claim
-- obeys (pause, a concurrency cap, a rate limit), backpressure at enqueue
-- (max_pending), serial keys, and each worker's version.

-- One row per queue that has a setting (or has ever had serial-keyed jobs).
-- A queue without a row claims on the fast path, exactly as before; a claim
-- of a queue with a row locks it (FOR UPDATE) for the length of the claim
-- statement, so the counts a limit is checked against cannot change under it.
CREATE TABLE jobkeeper_queues (
    name         text        PRIMARY KEY,
    paused       boolean     NOT NULL DEFAULT false,
    -- Jobs claimed or running at once, on all workers together.
    concurrency  integer     CHECK (concurrency >= 1),
    -- Starts (claims) per rate_period seconds, in every sliding window.
    rate_limit   integer     CHECK (rate_limit >= 1),
    rate_period  double precision CHECK (rate_period > 0),
    -- Enqueues are refused past this many scheduled/available/claimed/retryable jobs.
    max_pending  bigint      CHECK (max_pending >= 0),
    -- Set by the first enqueue with a serial_key: the queue's claims must
    -- then take the serial path (one held job per key).
    serial       boolean     NOT NULL DEFAULT false,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT jobkeeper_queues_rate_whole CHECK ((rate_limit IS NULL) = (rate_period IS NULL))
);

-- Claim times of rate-limited queues, one row per claim batch: the sliding
-- window is counted here, not from job rows (retention prunes those, and a
-- job claimed twice started twice). Rows older than the period are pruned by
-- the claims themselves.
CREATE TABLE jobkeeper_queue_starts (
    queue      text             NOT NULL,
    started_at timestamptz      NOT NULL,
    jobs       integer          NOT NULL CHECK (jobs > 0)
);
CREATE INDEX jobkeeper_queue_starts_idx ON jobkeeper_queue_starts (queue, started_at);

-- Jobs with the same serial_key are never held (claimed or running) at once.
ALTER TABLE jobkeeper_jobs ADD COLUMN serial_key text;
ALTER TABLE jobkeeper_dead_letters ADD COLUMN serial_key text;
-- The serial claim's checks ("is the key held?", "is an earlier job of the
-- key due?"); rows without a key stay out of it.
CREATE INDEX jobkeeper_jobs_serial_idx
    ON jobkeeper_jobs (serial_key, status)
    WHERE serial_key IS NOT NULL;

-- The jobkeeper version of each worker (NULL: a version from before flow
-- control, which claims without looking at jobkeeper_queues).
ALTER TABLE jobkeeper_workers ADD COLUMN version text;

-- The claim of a queue with settings, in one round trip. Each statement of
-- a PL/pgSQL function takes a fresh snapshot under READ COMMITTED, so the
-- counts below, read after the queue's row lock is granted, see every claim
-- committed by the session that held the lock before: a subquery of one
-- statement would keep the snapshot taken before the lock wait, and two
-- workers could both claim under one cap (SKIP LOCKED alone does not stop it).
-- The lock is held for this transaction only (one claim), never for a job.
-- Rate windows use clock_timestamp(), the time the claim really happens:
-- now() is the transaction's start, before the lock wait.
CREATE FUNCTION jobkeeper_claim_limited(p_queue text, p_worker_id text, p_limit integer)
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
        FROM candidates
        WHERE job.id = candidates.id
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
        FROM candidates
        WHERE job.id = candidates.id
        RETURNING job.*;
    END IF;
    GET DIAGNOSTICS claimed = ROW_COUNT;
    IF settings.rate_limit IS NOT NULL AND claimed > 0 THEN
        INSERT INTO jobkeeper_queue_starts (queue, started_at, jobs)
        VALUES (p_queue, claim_at, claimed);
    END IF;
END
$$;
