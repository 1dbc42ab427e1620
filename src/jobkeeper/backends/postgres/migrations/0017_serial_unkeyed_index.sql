-- Version 17: an index of the unkeyed jobs of serial queues, so that a
-- serial claim finds the unkeyed jobs it may take without reading past the
-- keyed jobs ahead of them. A claim that took fewer jobs than it asked for
-- (fewer free keys than a worker's free slots and prefetch) filled itself
-- with unkeyed jobs from anywhere in the queue by walking the claim index
-- and reading every keyed job on the way: the whole queue when it holds
-- none (a claim of 100 over 50 keys: 4 ms at 22,000 jobs, 9 ms at 100,000).
--
-- serial_unkeyed is true on a job without a serial key whose queue was
-- serial when the job was written (enqueued, requeued from the dead
-- letters, retried) or when the queue became serial (the first serial-keyed
-- enqueue flags the queue's unfinished jobs); NULL otherwise, so jobs of
-- other queues stay out of the index and their enqueues do not pay for it.
-- A job can miss its flag: written by a worker or producer of version 16
-- during a rolling deploy, or enqueued while the queue's first keyed job was
-- (that enqueue read the queue before it was marked). Such a job is still
-- taken, in claim order, when a walk of the queue's head reaches it; it no
-- longer fills short claims from deep in the queue.
--
-- The claim function keeps its signature and result: a worker of version 16
-- calls the new body unchanged. Its own enqueues leave their jobs unflagged
-- (above).
ALTER TABLE jobkeeper_jobs ADD COLUMN serial_unkeyed boolean;

-- Reads the jobs table once, holding writes back meanwhile (seconds for
-- millions of rows).
CREATE INDEX jobkeeper_jobs_serial_unkeyed_idx
    ON jobkeeper_jobs (queue, priority, scheduled_at, id)
    WHERE status = 'available' AND serial_unkeyed;

UPDATE jobkeeper_jobs AS job SET serial_unkeyed = true
FROM jobkeeper_queues AS settings
WHERE settings.serial AND job.queue = settings.name AND job.serial_key IS NULL
  AND job.status IN ('scheduled', 'available', 'claimed', 'running', 'retryable');

CREATE OR REPLACE FUNCTION jobkeeper_claim_limited(p_queue text, p_worker_id text, p_limit integer)
RETURNS SETOF jobkeeper_jobs
LANGUAGE plpgsql
-- Its statements are small and run once per claim: once ANALYZE has seen a
-- large queue, a head walk grown to the whole queue was planned above
-- jit_above_cost and compiled, up to a second on each new connection, while
-- the queue's row was locked.
SET jit = off
AS $$
DECLARE
    settings jobkeeper_queues%ROWTYPE;
    allowed  integer := p_limit;
    held     integer;
    started  bigint;
    claim_at timestamptz;
    claimed  integer;
    keys     text[];
    first_walk      bigint;
    walk_budget     bigint;
    key_budget      bigint;
    failed_key_budget bigint := 0;
    walked          bigint;
    found_jobs      bigint;
    key_list        text[];
    cutoff_priority integer;
    cutoff_at       timestamptz;
    cutoff_id       bigint;
    candidate_ids   bigint[];
    held_keys       text[] := '{}';
    held_room       integer := 64;
    new_held        text[];
    head_unkeyed    bigint[];
    from_head       boolean := false;
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
        -- A keyed job may be taken only while it is its key's first due job
        -- in the queue (priority, scheduled_at, id) and no job of the key is
        -- held anywhere. The candidate keys are those of the keyed jobs the
        -- claim would take, as this snapshot sees them, found one of two
        -- ways, each cheap where the other is not:
        -- * a walk of the queue's head in claim order: a key's first job in
        --   the queue is its first in the head, so no probe per job. It
        --   suits many shallow keys, whose first jobs come early;
        -- * a walk over the queue's keys (a loose index scan of
        --   jobkeeper_jobs_serial_queue_idx, one probe per key). It suits few
        --   deep keys, where the takeable jobs lie behind thousands of jobs
        --   of held keys. It orders by (queue, serial_key) so that the
        --   planner takes that index, which holds available jobs only, and
        --   not jobkeeper_jobs_serial_idx, where a key without available
        --   jobs would be stepped over one finished job at a time.
        -- Each round tries a head of walk_budget jobs, then up to key_budget
        -- keys, and the next round eight times as many of each, so a claim
        -- costs a constant times the cheaper of the two.
        first_walk := allowed::bigint * 2 + 256;
        walk_budget := first_walk;
        LOOP
            WITH head AS MATERIALIZED (
                SELECT queued.id, queued.serial_key, queued.priority, queued.scheduled_at,
                       row_number() OVER (
                           ORDER BY queued.priority, queued.scheduled_at, queued.id) AS place
                FROM (
                    SELECT job.id, job.serial_key, job.priority, job.scheduled_at
                    FROM jobkeeper_jobs AS job
                    WHERE job.status = 'available' AND job.queue = p_queue
                      AND (job.serial_key IS NULL OR NOT (job.serial_key = ANY(held_keys)))
                    ORDER BY job.priority, job.scheduled_at, job.id
                    LIMIT walk_budget) AS queued
            ), ordered AS MATERIALIZED (
                -- Each key's first place by hashing, not by sorting the
                -- keys' text; then in claim order.
                SELECT head.serial_key, head.priority, head.scheduled_at, head.id
                FROM head
                WHERE head.serial_key IS NULL
                   OR head.place IN (
                        SELECT min(keyed.place) FROM head AS keyed
                        WHERE keyed.serial_key IS NOT NULL
                        GROUP BY keyed.serial_key)
                ORDER BY head.place
            ), taken AS MATERIALIZED (
                -- Read in the order stored above, with no sort of its own,
                -- so that the holder probes stop once the claim is full.
                SELECT ordered.serial_key, ordered.priority, ordered.scheduled_at, ordered.id
                FROM ordered
                WHERE ordered.serial_key IS NULL
                   OR NOT EXISTS (
                        SELECT 1 FROM jobkeeper_jobs AS holder
                        WHERE holder.serial_key = ordered.serial_key
                          AND holder.status IN ('claimed', 'running'))
                LIMIT allowed
            )
            SELECT (SELECT count(*) FROM head), (SELECT count(*) FROM taken),
                   coalesce(
                       (SELECT array_agg(DISTINCT taken.serial_key ORDER BY taken.serial_key)
                        FROM taken WHERE taken.serial_key IS NOT NULL), '{}'),
                   last.priority, last.scheduled_at, last.id,
                   coalesce(
                       (SELECT array_agg(taken.id) FROM taken WHERE taken.serial_key IS NULL),
                       '{}')
            INTO walked, found_jobs, keys, cutoff_priority, cutoff_at, cutoff_id, head_unkeyed
            FROM (SELECT 1) AS one
            LEFT JOIN LATERAL (
                SELECT taken.priority, taken.scheduled_at, taken.id FROM taken
                ORDER BY taken.priority DESC, taken.scheduled_at DESC, taken.id DESC
                LIMIT 1) AS last ON true;
            IF found_jobs >= allowed OR walked < walk_budget THEN
                from_head := true;
                EXIT;
            END IF;
            -- A probe for the next key costs about as much as reading 30 jobs
            -- of the head (8 us against 0.3 us, measured without statistics
            -- or a visibility map): a round walks a 32nd as many keys as its
            -- head had jobs. Except the first, which walks the second
            -- round's keys, and the second then walks none: with few keys
            -- (50, say) the first walk over them answers, where it came only
            -- after a second head walk, eight times the first; with many,
            -- the claim walks no more keys than before, only sooner. A walk
            -- is not repeated with a budget that already found too many (as
            -- after held keys were left out of the head, below).
            IF walk_budget = first_walk THEN
                key_budget := walk_budget / 4;
            ELSE
                key_budget := walk_budget / 32;
            END IF;
            IF key_budget > failed_key_budget THEN
                key_list := ARRAY(
                    WITH RECURSIVE serial_keys(key) AS (
                        (SELECT lowest.serial_key FROM jobkeeper_jobs AS lowest
                         WHERE lowest.status = 'available' AND lowest.queue = p_queue
                           AND lowest.serial_key IS NOT NULL
                         ORDER BY lowest.queue, lowest.serial_key
                         LIMIT 1)
                        UNION ALL
                        SELECT (
                            SELECT next.serial_key FROM jobkeeper_jobs AS next
                            WHERE next.status = 'available' AND next.queue = p_queue
                              AND next.serial_key > serial_keys.key
                            ORDER BY next.queue, next.serial_key
                            LIMIT 1)
                        FROM serial_keys
                        WHERE serial_keys.key IS NOT NULL)
                    SELECT serial_keys.key FROM serial_keys
                    WHERE serial_keys.key IS NOT NULL
                    LIMIT key_budget + 1);
                IF cardinality(key_list) <= key_budget THEN
                    WITH taken AS MATERIALIZED (
                        SELECT listed.key, first.priority, first.scheduled_at, first.id
                        FROM unnest(key_list) AS listed(key)
                        CROSS JOIN LATERAL (
                            SELECT queued.priority, queued.scheduled_at, queued.id
                            FROM jobkeeper_jobs AS queued
                            WHERE queued.serial_key = listed.key AND queued.queue = p_queue
                              AND queued.status = 'available'
                            ORDER BY queued.priority, queued.scheduled_at, queued.id
                            LIMIT 1) AS first
                        WHERE NOT EXISTS (
                            SELECT 1 FROM jobkeeper_jobs AS holder
                            WHERE holder.serial_key = listed.key
                              AND holder.status IN ('claimed', 'running'))
                        ORDER BY first.priority, first.scheduled_at, first.id
                        LIMIT allowed
                    )
                    SELECT (SELECT count(*) FROM taken),
                           coalesce(
                               (SELECT array_agg(taken.key ORDER BY taken.key) FROM taken), '{}'),
                           last.priority, last.scheduled_at, last.id
                    INTO found_jobs, keys, cutoff_priority, cutoff_at, cutoff_id
                    FROM (SELECT 1) AS one
                    LEFT JOIN LATERAL (
                        SELECT taken.priority, taken.scheduled_at, taken.id FROM taken
                        ORDER BY taken.priority DESC, taken.scheduled_at DESC, taken.id DESC
                        LIMIT 1) AS last ON true;
                    EXIT;
                END IF;
                failed_key_budget := key_budget;
            END IF;
            -- Too few jobs in the head, and too many keys to walk them
            -- instead, a second time: the head is mostly jobs of held keys,
            -- each deep (a key's jobs other than its first are never
            -- takeable). Those of the head's keys that are held are left out
            -- of the walks from now on, read past by the index scan instead
            -- of numbered and grouped, and the same head is walked again.
            -- Not in the first round: with a few dozen keys, most of them
            -- held, a walk over the keys answers, and reading
            -- past the held keys' jobs first cost a quarter of the drain
            -- (benchmarks/flow.py, all keyed over 50 keys). The test is
            -- linear per job, so at most 64 keys are left out; a head with
            -- more held keys than that is walked as before (leaving out 64
            -- of 800 shallow held keys only added a pass: twice the time of
            -- a claim on SQLite, break-test 20).
            IF walk_budget > first_walk AND held_room > 0 THEN
                new_held := ARRAY(
                    SELECT keyed.key FROM (
                        SELECT DISTINCT head.serial_key AS key FROM (
                            SELECT job.serial_key FROM jobkeeper_jobs AS job
                            WHERE job.status = 'available' AND job.queue = p_queue
                              AND job.serial_key IS NOT NULL
                              AND NOT (job.serial_key = ANY(held_keys))
                            ORDER BY job.priority, job.scheduled_at, job.id
                            LIMIT walk_budget) AS head) AS keyed
                    WHERE EXISTS (
                        SELECT 1 FROM jobkeeper_jobs AS holder
                        WHERE holder.serial_key = keyed.key
                          AND holder.status IN ('claimed', 'running'))
                    LIMIT held_room + 1);
                IF cardinality(new_held) > held_room THEN
                    held_room := 0;
                ELSIF cardinality(new_held) > 0 THEN
                    held_keys := held_keys || new_held;
                    held_room := held_room - cardinality(new_held);
                    CONTINUE;
                END IF;
            END IF;
            walk_budget := walk_budget * 8;
        END LOOP;
        IF found_jobs < allowed THEN
            -- Short of the claim's size: unkeyed jobs anywhere in the queue
            -- may fill it.
            cutoff_priority := 2147483647;
            cutoff_at := 'infinity';
            cutoff_id := 9223372036854775807;
        END IF;
        PERFORM pg_advisory_xact_lock(hashtextextended('jobkeeper_serial:' || key, 0))
        FROM unnest(keys) AS key;
        -- The candidates, with a fresh snapshot: the unkeyed jobs up to the
        -- last job found above (after it, the claim is full), and the first
        -- job of each locked key that nobody holds now. A first job locked
        -- by another session is skipped below, and then its key waits: its
        -- second job is not first.
        IF from_head THEN
            -- The head walk saw every job up to the cutoff (or the whole
            -- queue): its unkeyed jobs are the ones the claim may take.
            -- Walking the queue again for them read every keyed job ahead,
            -- held keys' too: 21 ms behind 100,000 of them.
            candidate_ids := head_unkeyed;
        ELSE
        candidate_ids := ARRAY(
            -- "(priority, scheduled_at, id) <= cutoff" as three ranges, not a
            -- row comparison: PostgreSQL 15 ends an index scan on a row
            -- comparison's first column only, so with equal priorities (and a
            -- bulk enqueue's equal scheduled_at) it read the queue to its end
            -- (8 ms at 150,000 jobs for 67 rows).
            -- Flagged jobs only (jobkeeper_jobs_serial_unkeyed_idx): the claim
            -- index with "serial_key IS NULL" read past every keyed job ahead
            -- of them, the whole queue when the claim was short. An unkeyed job
            -- left unflagged is taken when a head walk reaches it.
            SELECT unkeyed.id FROM (
                (SELECT job.id, job.priority, job.scheduled_at
                 FROM jobkeeper_jobs AS job
                 WHERE job.status = 'available' AND job.queue = p_queue
                   AND job.priority < cutoff_priority
                   AND job.serial_unkeyed
                 ORDER BY job.priority, job.scheduled_at, job.id
                 LIMIT allowed)
                UNION ALL
                (SELECT job.id, job.priority, job.scheduled_at
                 FROM jobkeeper_jobs AS job
                 WHERE job.status = 'available' AND job.queue = p_queue
                   AND job.priority = cutoff_priority AND job.scheduled_at < cutoff_at
                   AND job.serial_unkeyed
                 ORDER BY job.priority, job.scheduled_at, job.id
                 LIMIT allowed)
                UNION ALL
                (SELECT job.id, job.priority, job.scheduled_at
                 FROM jobkeeper_jobs AS job
                 WHERE job.status = 'available' AND job.queue = p_queue
                   AND job.priority = cutoff_priority AND job.scheduled_at = cutoff_at
                   AND job.id <= cutoff_id
                   AND job.serial_unkeyed
                 ORDER BY job.priority, job.scheduled_at, job.id
                 LIMIT allowed)) AS unkeyed
            ORDER BY unkeyed.priority, unkeyed.scheduled_at, unkeyed.id
            LIMIT allowed);
        END IF;
        candidate_ids := candidate_ids || ARRAY(
            SELECT first.id FROM unnest(keys) AS locked(key)
            CROSS JOIN LATERAL (
                SELECT queued.id FROM jobkeeper_jobs AS queued
                WHERE queued.serial_key = locked.key AND queued.queue = p_queue
                  AND queued.status = 'available'
                ORDER BY queued.priority, queued.scheduled_at, queued.id
                LIMIT 1) AS first
            WHERE NOT EXISTS (
                SELECT 1 FROM jobkeeper_jobs AS holder
                WHERE holder.serial_key = locked.key
                  AND holder.status IN ('claimed', 'running')));
        -- The candidates are locked through the primary key alone, then
        -- checked and put in claim order: with its own "available" test and
        -- ORDER BY, the locking scan may walk the claim index over every
        -- keyed job of the queue (the plan taken without statistics, 184 ms
        -- at 22,000 jobs). Locked, a row is its latest version. The few
        -- locked and not taken are let go at the commit, which follows.
        RETURN QUERY
        WITH locked AS MATERIALIZED (
            SELECT job.id, job.status, job.queue, job.priority, job.scheduled_at
            FROM jobkeeper_jobs AS job
            WHERE job.id = ANY(candidate_ids)
            FOR UPDATE OF job SKIP LOCKED
        ), candidates AS MATERIALIZED (
            SELECT locked.id FROM locked
            WHERE locked.status = 'available' AND locked.queue = p_queue
            ORDER BY locked.priority, locked.scheduled_at, locked.id
            LIMIT allowed
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
