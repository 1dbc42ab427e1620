-- Every runtime statement of the PostgreSQL backend. A block runs from its
-- "-- name:" line to the next; names equal the PostgresBackend methods.
-- Batched statements take parallel arrays and unnest them, so one round trip
-- carries any number of rows. Arrays travel in binary (%(name)b): psycopg's
-- text-format array quoting cost more than the statement itself in profiles.
-- The worker's per-job writes (job_start_many, job_complete_many*) take
-- literals built in C instead (%(name)s::type[], see arrays.py): cheaper still.
-- Rows go back as named columns, never *: the connections prepare their
-- statements, and PostgreSQL refuses a prepared statement whose result
-- columns a migration changed ({job_columns}, {job_columns_qualified} with
-- "job.", and {dead_letter_columns}: the columns this version reads).
-- {utc_now_text} is now() as ISO 8601 text in UTC, the "at" of error entries,
-- whatever the session's TimeZone. {clock} is now(), or the caller's
-- %(now)s when it pinned the time (the time-dependent operations' now=).

-- name: job_insert_many
-- Rows are inserted in input order (ORDER BY ord), so ids ascend with it.
-- A (task, unique_key) that matches a pending job is skipped here and
-- resolved to that job by job_insert_many_pending.
-- Outside a transaction that checked max_pending (%(checked)s), a batch for
-- a queue with max_pending inserts nothing: the caller runs it again with
-- the check (see the PostgreSQL inserts).
-- One NOTIFY per queue of the jobs that are available (see
-- 0012_notify_from_inserts.sql): the one-time filter runs it once, after the
-- insert, and it is delivered at the commit.
-- An unkeyed job of a serial queue is flagged (serial_unkeyed, see
-- 0017_serial_unkeyed_index.sql); a batch with keyed jobs marked its queues
-- serial earlier in this transaction, so its unkeyed jobs there are too.
WITH inserted AS (
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at, unique_key, serial_key,
     trace_context, serial_unkeyed)
SELECT new.queue, new.task, new.args,
       CASE WHEN new.delay IS NOT NULL OR new.run_at > now() THEN 'scheduled'
            ELSE 'available' END,
       new.priority, new.max_attempts,
       CASE WHEN new.delay IS NOT NULL THEN now() + make_interval(secs => new.delay)
            ELSE coalesce(new.run_at, now()) END,
       new.unique_key, new.serial_key, new.trace_context,
       CASE WHEN new.serial_key IS NULL THEN (
           SELECT true FROM jobkeeper_queues AS settings
           WHERE settings.name = new.queue AND settings.serial) END
FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(args)b::json[], %(priorities)b::int[],
            %(max_attempts)b::int[], %(delays)b::float8[], %(run_ats)b::timestamptz[],
            %(unique_keys)b::text[], %(serial_keys)b::text[], %(trace_contexts)b::text[])
     WITH ORDINALITY
     AS new(queue, task, args, priority, max_attempts, delay, run_at, unique_key, serial_key,
            trace_context, ord)
WHERE %(checked)s OR NOT EXISTS (
    SELECT 1 FROM jobkeeper_queues
    WHERE name = ANY(%(queues)b::text[]) AND max_pending IS NOT NULL)
ORDER BY new.ord
ON CONFLICT (task, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
    DO NOTHING
RETURNING {job_columns}
)
SELECT * FROM inserted
WHERE (SELECT count(pg_notify(%(channel)s, queue))
       FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'available') AS woken) >= 0

-- name: job_insert_many_lock_keys
-- Batches with unique keys first take a transaction-scoped advisory lock per
-- bucket of (task, key), in the order of the array (sorted by the caller):
-- two batches sharing keys then never wait for each other in opposite orders.
-- unnest yields the elements in order and each row's lock is taken as it is
-- read. Advisory locks are per database: the key is jobkeeper's range ("jk",
-- 0x6A6B, in the top 16 bits), 38 bits of the md5 of the session's schema,
-- then the bucket (10 bits), so installations in separate schemas do not
-- wait for each other (unless two schemas' 38 bits agree), and one
-- schema's keys keep the buckets' order.
SELECT pg_advisory_xact_lock(
    7668222790528401408  -- 0x6A6B << 48
    | ((('x' || left(md5(coalesce(current_schema(), '')), 10))::bit(40)::bigint
        & 274877906943) << 10)
    | bucket)
FROM unnest(%(buckets)s::bigint[]) AS bucket;

-- name: job_insert_many_one
-- One job without a unique key (so no conflict is possible): plain
-- parameters plan and travel faster than eight one-element arrays, and the
-- caller builds the Job from its input plus what the server decided.
-- Nothing is inserted into a queue with max_pending unless the caller
-- checked it in this transaction (%(checked)s; see job_insert_many). An
-- available job is announced on the queue's channel; the caller ignores the
-- last column. An unkeyed job of a serial queue is flagged (see job_insert_many).
WITH inserted AS (
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at, serial_key, trace_context,
     serial_unkeyed)
SELECT
    %(queue)s, %(task)s, %(args)s::json,
    CASE WHEN %(delay)s::float8 IS NOT NULL OR %(run_at)s::timestamptz > now()
         THEN 'scheduled' ELSE 'available' END,
    %(priority)s, %(max_attempts)s,
    CASE WHEN %(delay)s::float8 IS NOT NULL THEN now() + make_interval(secs => %(delay)s::float8)
         ELSE coalesce(%(run_at)s::timestamptz, now()) END,
    %(serial_key)s, %(trace_context)s::text,
    CASE WHEN %(serial_key)s::text IS NULL THEN (
        SELECT true FROM jobkeeper_queues WHERE name = %(queue)s AND serial) END
WHERE %(checked)s OR NOT EXISTS (
    SELECT 1 FROM jobkeeper_queues WHERE name = %(queue)s AND max_pending IS NOT NULL)
RETURNING id, status, scheduled_at, created_at
)
SELECT id, status, scheduled_at, created_at,
       CASE WHEN status = 'available' THEN pg_notify(%(channel)s, %(queue)s) END
FROM inserted

-- name: job_insert_many_now
-- The single enqueue's usual job, outside a transaction: to run now, with no
-- key (see plans.is_single_statement). Sent through libpq itself (see
-- direct.py), so its parameters are $n, in text: $1 queue, $2 task, $3 args
-- (JSON text), $4 priority, $5 max_attempts, $6 trace_context, $7 the NOTIFY
-- channel. Half job_insert_many_one's parameters and columns: on the client,
-- binding and reading them was a tenth of the call. The job is available,
-- scheduled at created_at (both now()), and announced on the queue's channel;
-- the caller ignores the last column. One probe of the queue's settings row
-- (most queues have none) says both whether it is limited and whether it is
-- serial (the job is then flagged, see job_insert_many): 1 us a call more
-- than the probe for max_pending alone, where an aggregate over the row cost 6.
WITH inserted AS (
INSERT INTO jobkeeper_jobs (queue, task, args, priority, max_attempts, trace_context,
                            serial_unkeyed)
SELECT $1::text, $2::text, $3::json, $4::int, $5::int, $6::text, settings.serial OR NULL
FROM (SELECT) AS one
LEFT JOIN jobkeeper_queues AS settings ON settings.name = $1::text
WHERE settings.max_pending IS NULL
RETURNING id, created_at
)
SELECT id, created_at, pg_notify($7::text, $1::text) FROM inserted

-- name: job_insert_many_reserve_ids
-- The bulk path (COPY) takes its ids up front, ascending, and the
-- transaction's clock, to build the Jobs it returns without a RETURNING.
-- The sequence is looked up once (MATERIALIZED): called per row,
-- pg_get_serial_sequence's catalog lookup cost 3 us a job, more than nextval.
-- The ids are put in order by the caller: an ORDER BY here sorted them on
-- the server, 0.3 ms of the 1.8 ms this took for 1,000.
-- Also the serial queues, whose jobs the COPY flags (serial_unkeyed, see
-- job_insert_many; none has a key on this path).
WITH sequence AS MATERIALIZED (
    SELECT pg_get_serial_sequence('jobkeeper_jobs', 'id')::regclass AS id
)
SELECT now(), array_agg(nextval(sequence.id)),
       (SELECT coalesce(array_agg(name), '{}') FROM jobkeeper_queues WHERE serial)
FROM sequence, generate_series(1, %(count)s) AS n

-- name: job_insert_many_copy
-- Jobs to run now: status, scheduled_at and created_at take their defaults
-- ('available', and now(): the same transaction clock job_insert_many_reserve_ids read).
COPY jobkeeper_jobs (id, queue, task, args, priority, max_attempts, trace_context)
FROM STDIN

-- name: job_insert_many_copy_serial
-- job_insert_many_copy where the database has serial queues, whose jobs it
-- flags (see job_insert_many_reserve_ids).
COPY jobkeeper_jobs (id, queue, task, args, priority, max_attempts, trace_context,
                    serial_unkeyed)
FROM STDIN

-- name: job_insert_many_copy_scheduled
COPY jobkeeper_jobs
    (id, queue, task, args, status, priority, max_attempts, scheduled_at, created_at,
     trace_context, serial_unkeyed)
FROM STDIN

-- name: job_insert_many_pending
SELECT {job_columns_qualified}
FROM jobkeeper_jobs AS job
JOIN unnest(%(tasks)b::text[], %(unique_keys)b::text[]) AS wanted(task, unique_key)
  ON job.task = wanted.task AND job.unique_key = wanted.unique_key
WHERE job.status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')

-- name: job_insert_many_same_database
-- Where a connection is (the caller's connection= and ours), so that jobs are
-- never inserted into another database or schema than the queue's; and the
-- schema its search path finds jobkeeper_jobs in (see connection_setup: the
-- caller's session is theirs, so one that finds another schema's is refused).
SELECT current_database(), current_schema(),
       (SELECT namespace.nspname FROM pg_class AS relation
        JOIN pg_namespace AS namespace ON namespace.oid = relation.relnamespace
        WHERE relation.oid = to_regclass('jobkeeper_jobs'))

-- name: job_insert_many_open_transaction
-- Any statement opens the caller's (non-autocommit) transaction, so that the
-- insert that follows is a savepoint inside it, not a transaction of its own.
SELECT 1

-- name: job_claim
-- The candidate ids are MATERIALIZED before the UPDATE uses them: as a plain
-- subquery the planner may re-run the LIMITed, SKIP LOCKED scan and claim
-- more rows than asked. SKIP LOCKED lets many workers claim at once without
-- waiting on each other's row locks.
-- A queue with claim settings (paused, a cap, a rate, serial keys) claims
-- through jobkeeper_claim_limited instead: here it claims nothing and the one
-- row of all NULLs at the end says so (a primary-key probe of a small table,
-- so unlimited queues claim as fast as ever).
WITH limited AS MATERIALIZED (
    SELECT EXISTS (
        SELECT 1 FROM jobkeeper_queues
        WHERE name = %(queue)s
          AND (paused OR concurrency IS NOT NULL OR rate_limit IS NOT NULL OR serial)) AS yes
), candidates AS MATERIALIZED (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status = 'available' AND queue = %(queue)s AND NOT (SELECT yes FROM limited)
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
-- The job is 'claimed', not yet 'running': its start mark (job_start_many)
-- says when the task is called. The attempt is counted here (a claim that
-- ends unstarted gives it back) and fence numbers the claim.
UPDATE jobkeeper_jobs AS job
SET status = 'claimed',
    attempt = job.attempt + 1,
    fence = job.fence + 1,
    attempted_at = now(),
    finished_at = NULL,
    worker_id = %(worker_id)s
-- The ids as an array, not a join: prepared, the claim may run on a generic
-- plan, which cannot know the LIMIT (it guesses a tenth of the table) and
-- hash-joined the whole table to update a few rows; the array is always
-- probed through the primary key.
WHERE job.id = ANY(ARRAY(SELECT id FROM candidates))
-- Only what is not known already (status, holder...), times as UTC wall
-- clock, JSON as text (decoded by one shared decoder; errors only when there
-- are any): the claim is the worker's hottest read (see claimed_job()).
RETURNING job.id, job.queue, job.task, job.args::text, job.priority, job.attempt,
          job.max_attempts, job.scheduled_at AT TIME ZONE 'UTC',
          job.created_at AT TIME ZONE 'UTC', job.attempted_at AT TIME ZONE 'UTC',
          job.unique_key, nullif(job.errors, '[]'::jsonb)::text, job.fence,
          job.unstarted_returns, job.trace_context, job.run_alone
)
SELECT * FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM limited WHERE yes

-- name: queues_with_available
-- A worker's many queues asked in one statement: one probe per queue of the
-- partial claim index (jobkeeper_jobs_claim_idx, available rows only), a LIMIT
-- 1 under LATERAL so that the plan stays a nested loop of index probes (as
-- EXISTS, a queue of millions could be hashed whole). Its WHERE is the one
-- every claim path shares (job_claim and jobkeeper_claim_limited take only
-- available rows of the queue), so a queue left out here has nothing a claim
-- could take.
SELECT wanted.name
FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS wanted(name, place)
CROSS JOIN LATERAL (
    SELECT 1
    FROM jobkeeper_jobs AS job
    WHERE job.status = 'available' AND job.queue = wanted.name
    ORDER BY job.priority, job.scheduled_at, job.id
    LIMIT 1
) AS found
ORDER BY wanted.place

-- name: job_start_many
-- Start marks: claimed -> running when the task is really called, fenced on
-- the claim. A job whose outcome was written first is left alone.
-- The fenced writes of a holder (this one, the completions, the failures)
-- reach their rows by id, through the primary key, on any plan: they never
-- name the held statuses in a form the planner could match to
-- jobkeeper_jobs_held_idx, whose entries of jobs held and since finished
-- linger until a vacuum (a plan walking that index and joining each entry
-- with the batch took 2 s per completion in a drain). A row with the
-- holder's worker_id is held (claimed or running: the CHECK
-- jobkeeper_jobs_held_has_holder), so "held and not running" is "claimed".
UPDATE jobkeeper_jobs AS job
SET status = 'running', attempted_at = now()
FROM unnest(%(ids)s::bigint[], %(worker_ids)s::text[], %(attempts)s::int[], %(fences)s::int8[])
     AS started(id, worker_id, attempt, fence)
WHERE job.id = ANY(%(ids)s::bigint[]) AND job.id = started.id
  AND job.worker_id = started.worker_id AND job.attempt = started.attempt
  AND job.fence = started.fence AND job.status <> 'running'
RETURNING job.id

-- name: job_start_alone
-- The start mark of a run_alone job its worker starts alone: also records
-- the claim's fence in alone_fence, so a rescue of this very claim is a
-- crash pinned on the job (see the rescuer). Written before the task is
-- called: a job that kills its worker at once is found running, not claimed.
UPDATE jobkeeper_jobs
SET status = 'running', attempted_at = now(), alone_fence = fence
WHERE id = %(id)s AND worker_id = %(worker_id)s AND attempt = %(attempt)s
  AND fence = %(fence)s AND status = 'claimed'
RETURNING id

-- name: job_abandon_many
-- A stopping worker gives up on attempts whose code did not return after the
-- interrupt: they stay held (running) for the rescue, but the worker did not
-- crash under them, so their lone fence goes and the rescue pins no crash.
UPDATE jobkeeper_jobs AS job
SET alone_fence = NULL
FROM unnest(%(ids)s::bigint[], %(worker_ids)s::text[], %(attempts)s::int[], %(fences)s::int8[])
     AS held(id, worker_id, attempt, fence)
WHERE job.id = ANY(%(ids)s::bigint[]) AND job.id = held.id
  AND job.worker_id = held.worker_id AND job.attempt = held.attempt
  AND job.fence = held.fence
RETURNING job.id

-- name: job_complete_many
-- Fenced on (id, worker_id, attempt, fence): a worker whose claim was
-- rescued or handed back (and perhaps re-claimed, even at the same attempt)
-- writes nothing. A claimed job may complete before its start mark is
-- written (the mark is then skipped). A success stays completed even with a
-- cancel request: the work was done. An attempt that completed did not crash
-- its worker: a crash suspect is one no more (run_alone).
UPDATE jobkeeper_jobs AS job
SET status = 'completed', finished_at = now(), worker_id = NULL, result = done.result,
    run_alone = false
FROM unnest(%(ids)s::bigint[], %(worker_ids)s::text[], %(attempts)s::int[],
            %(fences)s::int8[], %(results)s::json[])
     AS done(id, worker_id, attempt, fence, result)
WHERE job.id = ANY(%(ids)s::bigint[]) AND job.id = done.id
  AND job.worker_id = done.worker_id AND job.attempt = done.attempt
  AND job.fence = done.fence
RETURNING job.id, job.awaited

-- name: job_complete_many_delete
-- retention = 0: completed jobs are deleted at once, with the same fence.
DELETE FROM jobkeeper_jobs AS job
USING unnest(%(ids)s::bigint[], %(worker_ids)s::text[], %(attempts)s::int[],
             %(fences)s::int8[])
     AS done(id, worker_id, attempt, fence)
WHERE job.id = ANY(%(ids)s::bigint[]) AND job.id = done.id
  AND job.worker_id = done.worker_id AND job.attempt = done.attempt
  AND job.fence = done.fence
RETURNING job.id, job.awaited

-- name: job_fail_many
-- Retryable, cancelled, released and returned outcomes (dead ones move:
-- job_fail_many_dead). "released" hands a job back (shutdown, a stalled
-- prefetch): available at once, and the interrupted attempt is not spent
-- (the error entry records it; a NULL error, for a job handed back
-- unstarted, adds none). "returned" is the rescuer's free return of a job
-- still claimed (never started) by a lost holder: available, attempt given
-- back, counted in unstarted_returns; only while the job is still claimed.
-- "snoozed" (Snooze) puts the job back to scheduled at now() + retry_in,
-- the attempt given back and no error entry (the attempt was not a failure).
-- A cancel request wins over every outcome here: the job ends cancelled
-- (the error entry kept), however the request reached the worker, or
-- whether it did at all (river#141, procrastinate#1133). cancel_requested is
-- read from the row being updated, so a cancel committed while this waits
-- on the row lock is seen.
-- %(stale_after)s is the rescuer's re-check that the holder is still silent,
-- so a holder that heartbeats again in the meantime keeps its job. Silent
-- means for longer than the holder's own rescue_after when it declared one.
UPDATE jobkeeper_jobs AS job
SET status = CASE WHEN job.cancel_requested THEN 'cancelled'
                  WHEN failed.outcome IN ('released', 'returned') THEN 'available'
                  WHEN failed.outcome = 'snoozed' THEN 'scheduled'
                  ELSE failed.outcome END,
    attempt = CASE WHEN failed.outcome IN ('released', 'returned', 'snoozed')
                   THEN job.attempt - 1 ELSE job.attempt END,
    unstarted_returns = job.unstarted_returns
                        + CASE failed.outcome WHEN 'returned' THEN 1 ELSE 0 END,
    finished_at = CASE WHEN job.cancel_requested THEN now()
                       WHEN failed.outcome IN ('released', 'returned', 'snoozed') THEN NULL
                       ELSE now() END,
    scheduled_at = CASE WHEN failed.outcome IN ('retryable', 'snoozed')
                             AND NOT job.cancel_requested
                        THEN now() + make_interval(secs => failed.retry_in)
                        ELSE job.scheduled_at END,
    worker_id = NULL,
    errors = CASE WHEN failed.error IS NULL THEN job.errors
                  ELSE job.errors || jsonb_build_array(
                           failed.error || jsonb_build_object('at', {utc_now_text})) END,
    -- The crash budget: a rescue of a running job (suspect) makes its next
    -- attempt run alone; a hand-back keeps what it was; any other outcome
    -- was written by a worker the attempt did not crash, so it runs as
    -- usual again. crash counts a pinned crash (see the rescuer).
    run_alone = CASE WHEN failed.suspect THEN true
                     WHEN failed.outcome IN ('released', 'returned') THEN job.run_alone
                     ELSE false END,
    crashes = job.crashes + failed.crash
FROM unnest(%(ids)b::bigint[], %(worker_ids)b::text[], %(attempts)b::int[],
            %(fences)b::int8[], %(outcomes)b::text[], %(errors)b::jsonb[],
            %(retry_ins)b::float8[], %(suspects)b::bool[], %(crashes)b::int[])
     AS failed(id, worker_id, attempt, fence, outcome, error, retry_in, suspect, crash)
WHERE job.id = ANY(%(ids)b::bigint[]) AND job.id = failed.id
  AND job.worker_id = failed.worker_id AND job.attempt = failed.attempt
  AND job.fence = failed.fence
  -- Held (the worker_id matched): claimed, or running unless returned.
  AND (job.status <> 'running' OR failed.outcome <> 'returned')
  AND (%(stale_after)s::float8 IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = job.worker_id
          AND worker.heartbeat_at > now() - make_interval(
                secs => coalesce(worker.rescue_after, %(stale_after)s::float8))))
RETURNING job.id, job.awaited AND job.status = 'cancelled' AS ended_awaited

-- name: job_fail_many_released_queues
-- The queues of jobs handed back by job_fail_many, to wake their workers.
SELECT DISTINCT queue FROM jobkeeper_jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: job_fail_many_lock
-- The rescuer's row locks, taken before job_fail_many and
-- job_fail_many_dead re-check that each holder is still silent: those are
-- later statements, so they judge by a snapshot taken once the rows are
-- ours. A holder's confirming read (job_confirm_holds) either ran before the
-- lock, after its fresh beat had committed, so that the snapshot has the
-- beat; or waits for this transaction's end and sees its outcome. Judged by a
-- snapshot taken before the lock, a rescue could return a job its holder
-- had just confirmed and started.
SELECT id FROM jobkeeper_jobs WHERE id = ANY(%(ids)b::bigint[]) ORDER BY id FOR UPDATE

-- name: job_fail_many_dead_lock
-- Row locks taken before job_fail_many_dead, in id order, in the same
-- transaction: its two branches split on cancel_requested, and a cancel
-- committed between its snapshot and its row locks would otherwise match
-- neither branch. Holding the locks first, its snapshot sees every cancel.
SELECT id FROM jobkeeper_jobs WHERE id = ANY(%(ids)b::bigint[]) ORDER BY id FOR UPDATE

-- name: job_fail_many_dead
-- Moves the job to the dead letters in one statement: the DELETE and the
-- INSERT commit together, so a job is always in exactly one of the tables.
-- A job with a cancel request is not moved: it ends cancelled (the error
-- entry kept), as in job_fail_many.
WITH failed AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(worker_ids)b::text[], %(attempts)b::int[],
                         %(fences)b::int8[], %(errors)b::jsonb[], %(reasons)b::text[],
                         %(crashes)b::int[])
                  AS failed(id, worker_id, attempt, fence, error, reason, crash)
), cancelled AS (
    UPDATE jobkeeper_jobs AS job
    SET status = 'cancelled', finished_at = now(), worker_id = NULL,
        errors = job.errors || jsonb_build_array(
                     failed.error || jsonb_build_object('at', {utc_now_text}))
    FROM failed
    WHERE job.id = failed.id AND job.worker_id = failed.worker_id
      AND job.attempt = failed.attempt AND job.fence = failed.fence
      AND job.status IN ('claimed', 'running') AND job.cancel_requested
      AND (%(stale_after)s::float8 IS NULL OR NOT EXISTS (
            SELECT 1 FROM jobkeeper_workers AS worker
            WHERE worker.id = job.worker_id
              AND worker.heartbeat_at > now() - make_interval(
                    secs => coalesce(worker.rescue_after, %(stale_after)s::float8))))
    RETURNING job.id, job.awaited
), moved AS (
    DELETE FROM jobkeeper_jobs AS job
    USING failed
    WHERE job.id = failed.id AND job.worker_id = failed.worker_id
      AND job.attempt = failed.attempt AND job.fence = failed.fence
      AND job.status IN ('claimed', 'running') AND NOT job.cancel_requested
      AND (%(stale_after)s::float8 IS NULL OR NOT EXISTS (
            SELECT 1 FROM jobkeeper_workers AS worker
            WHERE worker.id = job.worker_id
              AND worker.heartbeat_at > now() - make_interval(
                    secs => coalesce(worker.rescue_after, %(stale_after)s::float8))))
    RETURNING job.*, failed.error AS new_error, failed.reason AS new_reason,
              failed.crash AS new_crash
), dead AS (
    INSERT INTO jobkeeper_dead_letters
        (id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
         attempted_at, finished_at, unique_key, errors, result, reason, serial_key, crashes,
         fence)
    SELECT id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
           attempted_at, now(), unique_key,
           errors || jsonb_build_array(new_error || jsonb_build_object('at', {utc_now_text})),
           result, new_reason, serial_key, crashes + new_crash, fence
    FROM moved
    RETURNING id
)
SELECT dead.id, moved.awaited FROM dead JOIN moved ON moved.id = dead.id
UNION ALL
SELECT id, awaited FROM cancelled

-- name: job_stage_due
-- Due scheduled/retryable jobs become available; one NOTIFY per queue
-- that received any. SKIP LOCKED: stagers of several workers split the work.
-- The same statement answers when the next job of the caller's queues comes
-- due (by this clock: guarantee 7), so an idle worker can wake for it instead
-- of waiting out poll_interval. Only jobs not yet due count: a due one that
-- another stager holds locked is theirs to stage and NOTIFY about, and
-- counting it would have this worker stage again at once, round and round.
WITH due AS (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status IN ('scheduled', 'retryable') AND scheduled_at <= {clock}
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), staged AS (
    UPDATE jobkeeper_jobs AS job
    SET status = 'available'
    FROM due
    WHERE job.id = due.id
    RETURNING job.queue
), per_queue AS (
    SELECT queue, count(*) AS staged, pg_notify(%(channel)s, queue)
    FROM staged
    GROUP BY queue
)
SELECT (SELECT coalesce(sum(staged), 0) FROM per_queue)::bigint AS staged,
       -- The stager's index (scheduled_at), walked from now: the first row of
       -- these queues ends the scan.
       (SELECT extract(epoch FROM min(scheduled_at) - {clock})::float8
        FROM jobkeeper_jobs
        WHERE status IN ('scheduled', 'retryable') AND scheduled_at > {clock}
          AND queue = ANY(%(queues)b::text[])) AS next_due_in

-- name: job_next_due_in
-- Seconds until a job of these queues could be claimed (a burst worker stops
-- when none could within poll_interval). 0 while one is available in a queue
-- that is not paused nor at its concurrency, and whose serial key, if any,
-- nobody holds: a claim that came back empty is not proof there is none.
-- In a queue whose rate window is full, until the window's oldest start
-- leaves it. Else until the earliest scheduled or retryable job is due. NULL
-- when nothing could run before a queue is resumed or a held job ends (a
-- burst worker does not wait for other workers' jobs).
WITH open AS (
    SELECT served.name, settings.rate_limit, settings.rate_period
    FROM unnest(%(queues)b::text[]) AS served(name)
    LEFT JOIN jobkeeper_queues AS settings ON settings.name = served.name
    WHERE NOT coalesce(settings.paused, false)
      AND (settings.concurrency IS NULL OR settings.concurrency > (
            SELECT count(*) FROM jobkeeper_jobs AS held
            WHERE held.queue = served.name AND held.status IN ('claimed', 'running')))
      -- A job without a serial key, found by the claim index in its order
      -- (ORDER BY and LIMIT keep that plan: as one EXISTS with the serial
      -- test in its filter, the planner costed a sequential scan of the
      -- table at 167,000 for 40,000 jobs, above jit_above_cost, and every
      -- burst worker's first empty claim spent a second compiling it), or a
      -- job whose serial key nobody holds.
      AND ((SELECT job.id FROM jobkeeper_jobs AS job
            WHERE job.status = 'available' AND job.queue = served.name
              AND job.serial_key IS NULL
            ORDER BY job.queue, job.priority, job.scheduled_at, job.id
            LIMIT 1) IS NOT NULL
        OR EXISTS (
            SELECT 1 FROM jobkeeper_jobs AS job
            WHERE job.status = 'available' AND job.queue = served.name
              AND job.serial_key IS NOT NULL
              AND NOT EXISTS (
                    SELECT 1 FROM jobkeeper_jobs AS holder
                    WHERE holder.serial_key = job.serial_key
                      AND holder.status IN ('claimed', 'running'))))
), ready AS (
    SELECT CASE WHEN open.rate_limit IS NULL THEN 0 ELSE (
        SELECT CASE WHEN coalesce(sum(starts.jobs), 0) < open.rate_limit THEN 0
                    ELSE extract(epoch FROM min(starts.started_at)
                                 + make_interval(secs => open.rate_period) - {clock})::float8
               END
        FROM jobkeeper_queue_starts AS starts
        WHERE starts.queue = open.name
          AND starts.started_at > {clock} - make_interval(secs => open.rate_period))
    END AS due_in
    FROM open
)
SELECT least(
    (SELECT min(due_in) FROM ready),
    (SELECT extract(epoch FROM min(scheduled_at) - {clock})::float8
     FROM jobkeeper_jobs
     WHERE status IN ('scheduled', 'retryable') AND queue = ANY(%(queues)b::text[])))

-- name: job_rescue_candidates
-- Held jobs (claimed or running) of silent holders. Rescue does not depend on the holder's worker row existing: a job whose
-- holder was pruned is as orphaned as one whose holder went silent
-- (procrastinate#1518). A holder is silent once its heartbeat is older than
-- its own declared rescue_after (else %(rescue_after)s, the rescuer's window
-- for holders that declared none): a rescuer with a shorter window than a
-- live holder's must not take its jobs.
SELECT {job_columns_qualified}
FROM jobkeeper_jobs AS job
WHERE job.status IN ('claimed', 'running')
  AND NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = job.worker_id
          AND worker.heartbeat_at > {clock} - make_interval(
                secs => coalesce(worker.rescue_after, %(rescue_after)s::float8)))
ORDER BY job.id
LIMIT %(limit)s

-- name: job_cancel_requested
SELECT id, worker_id, attempt, fence
FROM jobkeeper_jobs
WHERE worker_id = %(worker_id)s AND status IN ('claimed', 'running') AND cancel_requested

-- name: job_held_by
SELECT {job_columns}
FROM jobkeeper_jobs
WHERE worker_id = %(worker_id)s AND status IN ('claimed', 'running')

-- name: job_confirm_holds
-- What a worker reads to confirm its holds after a stale spell, before it
-- starts a job claimed before the spell. FOR SHARE waits for a rescue in
-- flight: a rescuer whose snapshot was taken just before our fresh beat
-- committed judges us silent, and until its return commits the job looks
-- held; we would start it beside its next holder (the chaos soak saw it
-- once). Waiting, the read sees the rescue's outcome: a row no longer ours
-- drops out. A rescue that has not locked the row yet judges after this
-- read, by a snapshot with our beat in it (job_fail_many_lock). Not
-- job_held_by: the heartbeat thread reads that one, and must never wait on
-- a paused rescuer's locks.
-- In id order, as the rescue locks: the two never deadlock.
SELECT {job_columns}
FROM jobkeeper_jobs
WHERE worker_id = %(worker_id)s AND status IN ('claimed', 'running')
ORDER BY id
FOR SHARE

-- name: job_prune_finished
WITH expired AS (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status IN ('completed', 'cancelled')
      AND finished_at < {clock} - make_interval(secs => %(older_than)s::float8)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobkeeper_jobs AS job
USING expired
WHERE job.id = expired.id

-- name: job_table_maintain_vacuum
-- Only when the server has autovacuum off (see the pruner). SKIP_LOCKED: if
-- another worker's pruner is already vacuuming, this one moves on.
VACUUM (SKIP_LOCKED, ANALYZE) jobkeeper_jobs

-- name: job_table_maintain_analyze
ANALYZE (SKIP_LOCKED) jobkeeper_jobs

-- name: job_table_maintain_stats
-- Rows changed since the last ANALYZE, live rows, and whether the table was
-- ever analyzed (by anyone).
SELECT coalesce(n_mod_since_analyze, 0), coalesce(n_live_tup, 0),
       last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL,
       current_setting('autovacuum') = 'on'
FROM pg_stat_user_tables
WHERE relid = 'jobkeeper_jobs'::regclass

-- name: job_get
SELECT {job_columns} FROM jobkeeper_jobs WHERE id = %(id)s

-- name: job_get_dead_letter
SELECT {dead_letter_columns} FROM jobkeeper_dead_letters WHERE id = %(id)s

-- name: job_list
SELECT {job_columns}
FROM jobkeeper_jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(worker_id)s::text IS NULL OR worker_id = %(worker_id)s::text)
  -- Keyset paging: the next page starts below the last id shown, so a deep
  -- page costs what the first does (no OFFSET walking the rows before it).
  AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_list_dead_letters
SELECT {dead_letter_columns}
FROM jobkeeper_dead_letters
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_list_ids
-- The ids a filtered cancel or retry acts on. One statement, so one snapshot
-- of both tables: a job that moves between statuses (or to the dead letters)
-- while the pages are read is listed once, never twice or not at all.
(SELECT id, status
 FROM jobkeeper_jobs
 WHERE status = ANY(%(statuses)s::text[])
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(task)s::text IS NULL OR task = %(task)s::text)
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT id, 'dead'
 FROM jobkeeper_dead_letters
 WHERE 'dead' = ANY(%(statuses)s::text[])
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(task)s::text IS NULL OR task = %(task)s::text)
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_cancel
-- Pending jobs are cancelled at once; a held (claimed or running) job is
-- flagged and its worker (or the rescuer, if the worker is gone) finishes
-- the cancellation: whatever outcome it writes next but a success becomes
-- cancelled (see job_fail_many). One job, or many (a filtered `jobkeeper
-- cancel`, a thousand at a time).
UPDATE jobkeeper_jobs
SET status = CASE WHEN status IN ('claimed', 'running') THEN status ELSE 'cancelled' END,
    finished_at = CASE WHEN status IN ('claimed', 'running') THEN finished_at ELSE now() END,
    cancel_requested = true
WHERE id = ANY(%(ids)s::bigint[])
  AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
RETURNING {job_columns}

-- name: job_retry
-- Attempts and the crash budget start afresh; run_alone is kept (a crash
-- suspect still has its lone attempt to run). A job finished before its queue
-- became serial is flagged now (see job_insert_many). Only from
-- %(statuses)s: the statuses the caller saw (a dashboard page), each one of
-- retryable, cancelled, completed; and with %(fence)s only if no claim was
-- made since (the job did not run again, even back to the same status).
UPDATE jobkeeper_jobs
SET status = 'available', attempt = 0, unstarted_returns = 0, crashes = 0, scheduled_at = now(),
    finished_at = NULL, cancel_requested = false,
    serial_unkeyed = CASE WHEN serial_key IS NULL THEN (
        SELECT true FROM jobkeeper_queues AS settings
        WHERE settings.name = jobkeeper_jobs.queue AND settings.serial) END
WHERE id = %(id)s AND status = ANY(%(statuses)s::text[])
  AND (%(fence)s::bigint IS NULL OR fence = %(fence)s::bigint)
RETURNING {job_columns}

-- name: job_retry_many
-- job_retry of each job of %(ids)s in turn, the newest (largest id) first as
-- a filtered `jobkeeper retry` lists them, a thousand at a time: without a
-- fence, in one statement; the ids retried, and one NOTIFY per queue woken.
-- Where job_retry would hit the unique index (a cancelled or completed job
-- whose unique_key a pending job of its task holds), the job is left out
-- instead and the others go on: one by one, that job's retry was refused
-- and the next one's made.
WITH candidate AS (
    SELECT id, task, unique_key, status
    FROM jobkeeper_jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND status = ANY(%(statuses)s::text[])
), keyed AS (
    -- Finished jobs (outside the unique index) that would take a key back:
    -- of those sharing one, the first in turn; a retryable job keeps its
    -- own key, and holds it against them as any pending job does.
    SELECT id, task, unique_key,
           row_number() OVER (PARTITION BY task, unique_key ORDER BY id DESC) AS turn
    FROM candidate
    WHERE unique_key IS NOT NULL AND status IN ('cancelled', 'completed')
), chosen AS (
    SELECT id FROM candidate
    WHERE unique_key IS NULL OR status NOT IN ('cancelled', 'completed')
    UNION ALL
    SELECT id FROM keyed
    WHERE turn = 1 AND NOT EXISTS (
        SELECT 1 FROM jobkeeper_jobs AS holder
        WHERE holder.task = keyed.task AND holder.unique_key = keyed.unique_key
          AND holder.status IN ('scheduled', 'available', 'claimed', 'running', 'retryable'))
), retried AS (
    -- As job_retry. The status again: a job that changed since the
    -- snapshot is read anew (a pending holder committed since then is not:
    -- the unique index refuses the statement, which writes nothing).
    UPDATE jobkeeper_jobs
    SET status = 'available', attempt = 0, unstarted_returns = 0, crashes = 0,
        scheduled_at = now(), finished_at = NULL, cancel_requested = false,
        serial_unkeyed = CASE WHEN serial_key IS NULL THEN (
            SELECT true FROM jobkeeper_queues AS settings
            WHERE settings.name = jobkeeper_jobs.queue AND settings.serial) END
    WHERE id = ANY(ARRAY(SELECT id FROM chosen)) AND status = ANY(%(statuses)s::text[])
    RETURNING id, queue
)
SELECT id FROM retried
WHERE (SELECT count(pg_notify(%(channel)s, queue))
       FROM (SELECT DISTINCT queue FROM retried) AS woken) >= 0

-- name: dead_letter_requeue
-- Back to the jobs table with the same id, attempts reset, history kept;
-- one NOTIFY per queue, and unkeyed jobs of serial queues flagged (as
-- job_insert_many). The fence goes on from the dead letter's, never back:
-- a holder stale from before the move must not match a later claim. Where
-- none was recorded (0: a dead letter from before schema version 18, or
-- moved by a worker of 17), the attempts and errors entries stand in for it
-- (see migration 0018); rows.job_from_row shows a dead letter's alike.
WITH revived AS (
    DELETE FROM jobkeeper_dead_letters
    WHERE %(all)s OR id = ANY(%(ids)b::bigint[])
    RETURNING *
), inserted AS (
INSERT INTO jobkeeper_jobs
    (id, queue, task, args, status, priority, attempt, max_attempts, scheduled_at,
     created_at, attempted_at, finished_at, unique_key, errors, result, serial_key,
     serial_unkeyed, fence)
SELECT id, queue, task, args, 'available', priority, 0, max_attempts, now(),
       created_at, attempted_at, NULL, unique_key, errors, result, serial_key,
       CASE WHEN serial_key IS NULL THEN (
           SELECT true FROM jobkeeper_queues AS settings
           WHERE settings.name = revived.queue AND settings.serial) END,
       greatest(fence, attempt, CASE jsonb_typeof(errors)
                                    WHEN 'array' THEN jsonb_array_length(errors) ELSE 0 END)
FROM revived
RETURNING id, queue
)
SELECT id FROM inserted
WHERE (SELECT count(pg_notify(%(channel)s, queue))
       FROM (SELECT DISTINCT queue FROM inserted) AS woken) >= 0

-- name: dead_letter_requeue_conflicts
-- Why a requeue hit the unique index (it wrote nothing): the dead letters
-- being requeued that have a unique_key, each with the pending job of its
-- task that holds the key, if any (dead letters can also clash among themselves).
SELECT dead.id, dead.task, dead.unique_key,
       (SELECT job.id FROM jobkeeper_jobs AS job
        WHERE job.task = dead.task AND job.unique_key = dead.unique_key
          AND job.status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
        LIMIT 1) AS holder
FROM jobkeeper_dead_letters AS dead
WHERE dead.unique_key IS NOT NULL AND (%(all)s OR dead.id = ANY(%(ids)b::bigint[]))
ORDER BY dead.id

-- name: queue_stats
SELECT queue, status, count(*) FROM jobkeeper_jobs GROUP BY queue, status
UNION ALL
SELECT queue, 'dead', count(*) FROM jobkeeper_dead_letters GROUP BY queue

-- name: worker_register
INSERT INTO jobkeeper_workers
    (id, hostname, pid, queues, started_at, heartbeat_at, rescue_after, version)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s::jsonb, now(), now(), %(rescue_after)s,
        %(version)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()

-- name: worker_heartbeat
UPDATE jobkeeper_workers SET heartbeat_at = now() WHERE id = %(id)s

-- name: worker_deregister
DELETE FROM jobkeeper_workers WHERE id = %(id)s

-- name: worker_prune_stale
-- Never a row whose worker may still be alive by its own rescue_after: its
-- jobs would become rescuable with it.
DELETE FROM jobkeeper_workers
WHERE heartbeat_at < {clock} - make_interval(
          secs => greatest(%(older_than)s::float8, 2 * coalesce(rescue_after, 0)))

-- name: worker_list
SELECT id, hostname, pid, queues, started_at, heartbeat_at, rescue_after, version
FROM jobkeeper_workers
ORDER BY started_at

-- name: notify_queues
SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)b::text[]) AS queue

-- name: notify_due
-- Delayed jobs were inserted: per queue, the earliest due time as seconds
-- from now by this clock ("queue seconds"), so that a listening worker
-- stages then instead of at its next poll. The inserts announce only
-- available jobs; a payload with a space is one older workers ignore.
SELECT pg_notify(%(channel)s, queue || ' ' || greatest(extract(epoch FROM due_at - now()), 0))
FROM unnest(%(queues)b::text[], %(due_ats)b::timestamptz[]) AS due(queue, due_at)

-- name: notify_channel
-- The schema that names the NOTIFY channel (as the insert trigger of schema
-- versions 1-11 named it: workers of either version listen on the same one).
SELECT current_schema()

-- name: connection_backend_pid
-- The server's PID for this session: a pooler's client sees another one
-- from libpq (see prepared.direct_session).
SELECT pg_backend_pid()

-- name: connection_activity
-- What the sessions of calls without an answer are doing (the stuck-call
-- watchdog, stuck.py): running them (active), or waiting for their client
-- (idle: the answer was sent and never arrived); and for how long.
SELECT pid, state, wait_event,
       extract(epoch FROM clock_timestamp() - state_change)::float8
FROM pg_stat_activity
WHERE pid = ANY(%s)

-- name: connection_setup
-- On each new connection of ours: the server's PID (connection_backend_pid),
-- the schema the unqualified jobkeeper_jobs resolves to (NULL: none), and the
-- current schema (where migrate creates the tables) quoted as a search_path
-- (NULL: no schema of the search path exists). See session_setup.set_up.
SELECT pg_backend_pid(),
       (SELECT namespace.nspname FROM pg_class AS relation
        JOIN pg_namespace AS namespace ON namespace.oid = relation.relnamespace
        WHERE relation.oid = to_regclass('jobkeeper_jobs')),
       current_schema(), quote_ident(current_schema())

-- name: connection_pin_schema
-- Only the current schema on this session's search_path (see
-- connection_setup); statements then find jobkeeper's tables there or not at
-- all.
SELECT set_config('search_path', %s, false)

-- name: connection_iso_datestyle
-- ISO output for this session's dates and times, keeping the day/month order
-- of input the session was given: psycopg reads timestamptz text only in ISO
-- (see session_setup). Safe through PgBouncer: it tracks DateStyle per
-- client and restores it on whichever server connection serves the client.
SELECT set_config('DateStyle', 'ISO', false)

-- name: db_now
SELECT now()

-- name: schema_current
-- The schema migrate creates jobkeeper's tables in, whose migration lock it
-- takes (NULL: none on the search_path exists).
SELECT current_schema()

-- name: schema_lock
-- Serialises migrate() of one schema across processes for the rest of the
-- transaction.
SELECT pg_advisory_xact_lock(%s)

-- name: schema_lock_try
-- schema_lock without waiting: false when another migrate holds it, so
-- this one can say whom it waits for before it waits.
SELECT pg_try_advisory_xact_lock(%s)

-- name: schema_lock_holders
-- Who holds what migrate waits for, oldest transaction first: with
-- %(advisory)s, the migration lock (another migrate: an advisory lock on
-- the key's two halves); without, a lock on one of jobkeeper's tables in
-- the schema migrate creates them in (any lock at all conflicts with
-- schema_lock_jobs's, and with the ALTERs of other tables). The sessions of
-- short enqueues and claims come and go; the one with the oldest
-- transaction is what keeps migrate waiting.
SELECT activity.pid, coalesce(activity.application_name, '') AS application_name,
       coalesce(activity.state, '') AS state,
       extract(epoch FROM now() - activity.xact_start)::float8 AS open_for,
       left(coalesce(activity.query, ''), 120) AS query
FROM pg_stat_activity AS activity
WHERE activity.pid <> pg_backend_pid()
  AND activity.pid IN (
      SELECT lock.pid FROM pg_locks AS lock
      LEFT JOIN pg_class AS relation ON relation.oid = lock.relation
      WHERE lock.granted AND lock.database = (SELECT oid FROM pg_database
                                              WHERE datname = current_database())
        AND CASE WHEN %(advisory)s
            THEN lock.locktype = 'advisory' AND lock.objsubid = 1
                 AND (lock.classid::int8 << 32) | lock.objid::int8 = %(key)s
            ELSE lock.locktype = 'relation' AND relation.relkind IN ('r', 'p')
                 AND relation.relnamespace = (SELECT oid FROM pg_namespace
                                              WHERE nspname = current_schema())
                 AND relation.relname LIKE 'jobkeeper\_%%'
            END)
ORDER BY activity.xact_start NULLS LAST, activity.pid
LIMIT 5

-- name: schema_lock_jobs
-- Before migrations run on a schema in use: the jobs table, for the rest of
-- migrate's transaction, taken before any migration takes a weaker lock on
-- it. A migration that builds an index (SHARE) followed by one that alters
-- the table (ACCESS EXCLUSIVE) deadlocked with a claim in flight: the claim
-- function reads the table, then asks to write it, behind the SHARE lock,
-- while the ALTER waited for the claim's read (13 -> 17 in one migrate).
-- Workers wait meanwhile, as they waited for the index builds.
LOCK TABLE jobkeeper_jobs IN ACCESS EXCLUSIVE MODE

-- name: schema_create
CREATE TABLE IF NOT EXISTS jobkeeper_schema (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: schema_tables_exist
-- Whether the record of versions applied and the jobs table exist in the
-- schema where migrate creates tables (the first on the search path: with
-- "tenant, public" the tables in public are no reason to refuse a new
-- tenant, nor its version). The jobs table without a record, or with the
-- record empty, is a schema whose record was lost, not one to create. And
-- whether there is no current schema at all (none of the path exists).
SELECT EXISTS (SELECT 1 FROM pg_class AS relation
               JOIN pg_namespace AS namespace ON namespace.oid = relation.relnamespace
               WHERE namespace.nspname = current_schema()
                 AND relation.relname = 'jobkeeper_schema'),
       EXISTS (SELECT 1 FROM pg_class AS relation
               JOIN pg_namespace AS namespace ON namespace.oid = relation.relnamespace
               WHERE namespace.nspname = current_schema()
                 AND relation.relname = 'jobkeeper_jobs'),
       current_schema() IS NULL

-- name: schema_lock_wait
-- For the rest of the transaction (or until set again): give up on a lock
-- after this long (text, such as '1000ms') instead of waiting as long as it
-- takes. migrate's wait for the jobs table's lock holds every enqueue and
-- claim behind it, so it waits only this long at a time.
SELECT set_config('lock_timeout', %s, true)

-- name: schema_version
SELECT coalesce(max(version), 0) FROM jobkeeper_schema

-- name: schema_record
INSERT INTO jobkeeper_schema (version) VALUES (%s)

-- name: schema_index_exists
-- Whether the index named (in the search path) exists, valid or not.
SELECT to_regclass(%s) IS NOT NULL

-- name: schema_drop_serial_first_index
-- Version 13's serial index, replaced by version 14's queue-leading one.
-- Dropped after migrate's transaction commits, concurrently: in that
-- transaction it deadlocked with running workers (see migration 0014).
-- CONCURRENTLY waits for the transactions that hold a lock on the jobs
-- table when it starts, and blocks none; stopped midway, it leaves the
-- index invalid, and the next migrate drops it.
DROP INDEX CONCURRENTLY IF EXISTS jobkeeper_jobs_serial_first_idx

-- name: leader_try_acquire
-- Take the lease when it is free or expired, or extend it when it is ours;
-- a row comes back only then. The database clock judges expiry, so skewed
-- worker clocks cannot elect two leaders.
INSERT INTO jobkeeper_leader AS leader (name, worker_id, elected_at, expires_at)
VALUES (%(name)s, %(worker_id)s, {clock}, {clock} + make_interval(secs => %(ttl)s::float8))
ON CONFLICT (name) DO UPDATE
SET worker_id = excluded.worker_id,
    elected_at = CASE WHEN leader.worker_id = excluded.worker_id THEN leader.elected_at
                      ELSE {clock} END,
    expires_at = excluded.expires_at
WHERE leader.worker_id = excluded.worker_id OR leader.expires_at < {clock}
RETURNING worker_id

-- name: leader_resign
DELETE FROM jobkeeper_leader WHERE name = %(name)s AND worker_id = %(worker_id)s

-- name: leader_get
SELECT worker_id FROM jobkeeper_leader WHERE name = %(name)s AND expires_at >= now()

-- Reads and actions of the dashboard, /metrics and doctor. Each reads
-- through a partial index or stops at a cap, so none grows with the
-- completed rows kept for retention.

-- name: dead_letter_purge
-- Deletes dead letters for good: the given ids, those dead for more than
-- older_than seconds, or (neither given) all of them.
DELETE FROM jobkeeper_dead_letters
WHERE (%(ids)b::bigint[] IS NULL OR id = ANY(%(ids)b::bigint[]))
  AND (%(older_than)s::float8 IS NULL
       OR finished_at < now() - make_interval(secs => %(older_than)s::float8))
RETURNING id


-- name: queue_remove_jobs
-- jobkeeper verify's clean-up of its own queue (one transaction, all steps).
DELETE FROM jobkeeper_jobs WHERE queue = %(queue)s

-- name: queue_remove_dead_letters
DELETE FROM jobkeeper_dead_letters WHERE queue = %(queue)s

-- name: queue_remove_settings
DELETE FROM jobkeeper_queues WHERE name = %(queue)s

-- name: queue_remove_starts
DELETE FROM jobkeeper_queue_starts WHERE queue = %(queue)s

-- name: queue_remove_periodic
DELETE FROM jobkeeper_periodic WHERE queue = %(queue)s

-- name: dead_letter_prune
-- The pruner's pass under dead_retention: dead letters that died more than
-- older_than seconds ago, a batch at a time.
WITH expired AS (
    SELECT id
    FROM jobkeeper_dead_letters
    WHERE finished_at < {clock} - make_interval(secs => %(older_than)s::float8)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobkeeper_dead_letters AS dead
USING expired
WHERE dead.id = expired.id

-- name: job_serial_holders
-- Why a keyed job waits: the jobs holding its key (any queue), from the
-- serial index.
SELECT id FROM jobkeeper_jobs
WHERE serial_key = %(serial_key)s AND status IN ('claimed', 'running')
ORDER BY id

-- name: queue_starts_count
-- Starts of a rate-limited queue in the sliding window ending now (what the
-- limited claim counts).
SELECT coalesce(sum(jobs), 0)::bigint AS n
FROM jobkeeper_queue_starts
WHERE queue = %(queue)s
  AND started_at > now() - make_interval(secs => %(period)s::float8)

-- name: job_throughput
-- Jobs finished per bucket (its number: start / bucket) from %(from)s on,
-- from the finished index: the cost follows the rows since then, and the
-- process keeps the settled buckets (cockpit.py), so a reload reads only
-- the last minute or two.
SELECT floor(extract(epoch FROM finished_at) / %(bucket)s::float8)::bigint AS bucket,
       status, count(*) AS n
FROM jobkeeper_jobs
WHERE status IN ('completed', 'cancelled') AND finished_at >= %(from)s
GROUP BY 1, 2

-- name: queue_oldest_due
-- Per queue, its oldest job that could run now, in two parts (walked true,
-- then false). Available: the claim index orders a queue's jobs by priority
-- first, so its oldest is the oldest of the first jobs of its priorities; a
-- walk down the index takes those, two probes per (queue, priority), at
-- most %(pairs)s + 1 of them (more: queue_oldest_due_spread). Its cost
-- follows the pairs, not the backlog: sorting every available job instead
-- took 1.0-1.3 s at 600,000 (spilling to disk). Two arms rather than a row
-- comparison: see migration 0016 on how PostgreSQL 15 scans one.
-- Past due but not staged yet (the due index, none while a leader's
-- scheduler runs): a hashed min per queue, not a sort, then one probe for
-- the id; no index orders these rows by queue.
WITH RECURSIVE pair AS (
    (SELECT queue, priority, scheduled_at, id, 1 AS n FROM jobkeeper_jobs
     WHERE status = 'available'
     ORDER BY queue, priority, scheduled_at, id
     LIMIT 1)
    UNION ALL
    SELECT next.queue, next.priority, next.scheduled_at, next.id, pair.n + 1
    FROM pair, LATERAL (
        (SELECT queue, priority, scheduled_at, id FROM jobkeeper_jobs
         WHERE status = 'available' AND queue = pair.queue AND priority > pair.priority
         ORDER BY priority, scheduled_at, id
         LIMIT 1)
        UNION ALL
        (SELECT queue, priority, scheduled_at, id FROM jobkeeper_jobs
         WHERE status = 'available' AND queue > pair.queue
         ORDER BY queue, priority, scheduled_at, id
         LIMIT 1)
        LIMIT 1
    ) AS next
    WHERE pair.n <= %(pairs)s
)
SELECT true AS walked, queue, id, extract(epoch FROM scheduled_at)::float8 AS at,
       extract(epoch FROM now() - scheduled_at)::float8 AS age
FROM pair
UNION ALL
SELECT false, late.queue, first.id, extract(epoch FROM late.scheduled_at)::float8,
       extract(epoch FROM now() - late.scheduled_at)::float8
FROM (SELECT queue, min(scheduled_at) AS scheduled_at FROM jobkeeper_jobs
      WHERE status IN ('scheduled', 'retryable') AND scheduled_at <= now()
      GROUP BY queue) AS late,
     LATERAL (
        SELECT id FROM jobkeeper_jobs
        WHERE status IN ('scheduled', 'retryable') AND scheduled_at = late.scheduled_at
          AND queue = late.queue
        ORDER BY id
        LIMIT 1
     ) AS first

-- name: queue_oldest_due_spread
-- The oldest available job per queue when the available jobs hold more
-- (queue, priority) pairs than queue_oldest_due walks: a hashed min per
-- queue over the claim index (every available job, but no sort), then the
-- smallest id at that time.
SELECT spread.queue,
       (SELECT min(id) FROM jobkeeper_jobs
        WHERE status = 'available' AND queue = spread.queue
          AND scheduled_at = spread.scheduled_at) AS id,
       extract(epoch FROM spread.scheduled_at)::float8 AS at,
       extract(epoch FROM now() - spread.scheduled_at)::float8 AS age
FROM (SELECT queue, min(scheduled_at) AS scheduled_at FROM jobkeeper_jobs
      WHERE status = 'available'
      GROUP BY queue) AS spread

-- name: queue_counts_live
-- Exact counts of the live statuses, each arm from its partial index
-- (claim, due, held): their size follows the backlog.
SELECT queue, 'available' AS status, count(*) AS n FROM jobkeeper_jobs WHERE status = 'available'
GROUP BY queue
UNION ALL
SELECT queue, status, count(*) AS n FROM jobkeeper_jobs
WHERE status IN ('scheduled', 'retryable') GROUP BY queue, status
UNION ALL
SELECT queue, status, count(*) AS n FROM jobkeeper_jobs
WHERE status IN ('claimed', 'running') GROUP BY queue, status

-- name: queue_counts_finished
-- Completed and cancelled jobs per queue, reading at most %(cap)s rows (the
-- newest, down the finished index): exact while both together hold fewer.
-- A count per status would walk every finished row to find a rare one (the
-- index holds both).
SELECT queue, status, count(*) AS n
FROM (SELECT queue, status FROM jobkeeper_jobs
      WHERE status IN ('completed', 'cancelled')
      ORDER BY finished_at DESC
      LIMIT %(cap)s) AS sample
GROUP BY queue, status

-- name: queue_counts_finished_since
-- Above the cap: the jobs finished after the last recount, at most %(cap)s
-- (down the finished index).
SELECT queue, status, count(*) AS n
FROM (SELECT queue, status FROM jobkeeper_jobs
      WHERE status IN ('completed', 'cancelled') AND finished_at > %(since)s
      ORDER BY finished_at DESC
      LIMIT %(cap)s) AS recent
GROUP BY queue, status

-- name: queue_counts_finished_upto
-- The recount above the cap: every job finished up to %(upto)s. It reads
-- every finished row (0.2-0.8 s per 2 million), so it runs at most once a
-- minute.
SELECT queue, status, count(*) AS n FROM jobkeeper_jobs
WHERE status IN ('completed', 'cancelled') AND finished_at <= %(upto)s
GROUP BY queue, status

-- name: queue_counts_dead
SELECT queue, count(*) AS n
FROM (SELECT queue FROM jobkeeper_dead_letters LIMIT %(cap)s) AS sample
GROUP BY queue

-- name: queue_counts_dead_all
-- The recount of the dead letters above the cap.
SELECT queue, count(*) AS n FROM jobkeeper_dead_letters GROUP BY queue

-- name: queue_counts_of_queue
-- One queue's counts for pause, resume and configure_queue, as queue_counts
-- counts them with recount=False, but only %(queue)s's live rows: all
-- queues' took 0.3-1.0 s at 600,000 available jobs. Its available jobs come
-- from the claim index (led by queue), so another queue's backlog is never
-- read. The finished and dead arms read the same capped samples as
-- queue_counts_finished and queue_counts_dead and return, beside this
-- queue's rows in them, every queue's (sampled): a full sample means an
-- estimate, as there.
SELECT 'available' AS status, count(*) AS n, NULL::bigint AS sampled
FROM jobkeeper_jobs WHERE status = 'available' AND queue = %(queue)s
UNION ALL
SELECT status, count(*), NULL FROM jobkeeper_jobs
WHERE status IN ('scheduled', 'retryable') AND queue = %(queue)s GROUP BY status
UNION ALL
SELECT status, count(*), NULL FROM jobkeeper_jobs
WHERE status IN ('claimed', 'running') AND queue = %(queue)s GROUP BY status
UNION ALL
SELECT status, count(*) FILTER (WHERE queue = %(queue)s), count(*)
FROM (SELECT queue, status FROM jobkeeper_jobs
      WHERE status IN ('completed', 'cancelled')
      ORDER BY finished_at DESC
      LIMIT %(cap)s) AS sample
GROUP BY status
UNION ALL
SELECT 'dead', count(*) FILTER (WHERE queue = %(queue)s), count(*)
FROM (SELECT queue FROM jobkeeper_dead_letters LIMIT %(cap)s) AS sample

-- name: database_health_claim_plan
-- doctor: the claim's plan (not run) must walk jobkeeper_jobs_claim_idx.
EXPLAIN (FORMAT JSON)
SELECT id
FROM jobkeeper_jobs
WHERE status = 'available' AND queue = %(queue)s
ORDER BY priority, scheduled_at, id
LIMIT 10
FOR UPDATE SKIP LOCKED

-- name: database_health_table
-- doctor: dead tuples, vacuum history and autovacuum switches of the jobs
-- table (none when the schema is not migrated).
SELECT stat.n_live_tup AS live, stat.n_dead_tup AS dead,
       extract(epoch FROM now() - greatest(stat.last_vacuum, stat.last_autovacuum))::float8
           AS vacuumed_ago,
       current_setting('autovacuum') = 'on' AS autovacuum,
       -- The reloption as PostgreSQL reads it (off, 0, no, f...): it keeps the text written.
       coalesce((SELECT option_value::boolean FROM pg_options_to_table(cls.reloptions)
                 WHERE option_name = 'autovacuum_enabled'), true) AS table_autovacuum
FROM pg_stat_user_tables AS stat
JOIN pg_class AS cls ON cls.oid = stat.relid
WHERE stat.relid = to_regclass('jobkeeper_jobs')

-- name: database_health_indexes
-- doctor: indexes of the jobs table that are invalid (a CREATE or DROP INDEX
-- CONCURRENTLY stopped midway: written by every insert, read by no query),
-- or that a schema version replaced (%(retired)s) and migrate has not dropped.
SELECT ind.relname AS name, idx.indisvalid AS valid
FROM pg_index AS idx
JOIN pg_class AS ind ON ind.oid = idx.indexrelid
WHERE idx.indrelid = to_regclass('jobkeeper_jobs')
  AND (NOT idx.indisvalid OR ind.relname = ANY(%(retired)s::text[]))
ORDER BY ind.relname

-- name: database_health_xmin
-- doctor: what holds back the xmin horizon of this database (VACUUM cannot
-- remove rows it might still see), oldest first, with how long it has been
-- open: sessions with a snapshot or transaction, and prepared transactions
-- (two-phase commit), which outlive their session and show in no
-- pg_stat_activity row (gid set, pid null).
SELECT * FROM (
    SELECT pid, coalesce(state, '') AS state,
           extract(epoch FROM now() - xact_start)::float8 AS open_for,
           coalesce(age(backend_xmin), age(backend_xid)) AS xid_age,
           left(coalesce(query, ''), 120) AS query, NULL::text AS gid
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
      AND xact_start IS NOT NULL
    UNION ALL
    SELECT NULL, 'prepared', extract(epoch FROM now() - prepared)::float8, age(transaction),
           '', gid
    FROM pg_prepared_xacts
    WHERE database = current_database()
) AS holders
ORDER BY open_for DESC NULLS LAST
LIMIT 5

-- name: database_health_notify
-- doctor: the fraction of the NOTIFY queue in use (0..1); it fills when a
-- listener stops reading inside an open transaction.
SELECT pg_notification_queue_usage() AS usage

-- name: database_health_write_probe
-- doctor: a write that needs new space, in a transaction the caller rolls
-- back: a temporary table's first row extends a new file, so a full disk
-- fails it ("could not extend file ... No space left on device") where the
-- claim's and heartbeat's updates, fitting in pages that exist, still pass;
-- a read-only transaction or a standby refuses the CREATE.
CREATE TEMPORARY TABLE jobkeeper_write_probe ON COMMIT DROP AS
SELECT repeat('x', 64) AS filler

-- name: database_health_encoding
-- doctor: the database's encoding (jobkeeper's sessions speak UTF-8, which
-- the server converts; a character the encoding lacks is refused).
SELECT pg_encoding_to_char(encoding) AS encoding
FROM pg_database WHERE datname = current_database()


-- name: periodic_upsert
-- A worker's start: its code's definitions replace the stored ones (code is
-- the source of truth; graphile-worker's _private_known_crontabs upsert is
-- the model). An unchanged schedule keeps its tick record and its seen_at:
-- a fleet coming back must still see how long it was away, to tell missed
-- ticks from ticks a worker was there for. A new or changed schedule starts
-- from now: no catch-up from before it existed, nor of the old schedule's.
-- ON CONFLICT's SET reads the old row (p.*) whatever the order of its items.
-- Rows are written in name order, so two workers starting at once lock
-- them in the same order (no deadlock).
INSERT INTO jobkeeper_periodic AS p
    (name, schedule, timezone, task, queue, priority, max_attempts, args, catch_up,
     since_at, seen_at, created_at, updated_at)
SELECT d.name, d.schedule, d.timezone, d.task, d.queue, d.priority, d.max_attempts, d.args,
       d.catch_up, now(), now(), now(), now()
FROM unnest(%(names)b::text[], %(schedules)b::text[], %(timezones)b::text[], %(tasks)b::text[],
            %(queues)b::text[], %(priorities)b::int[], %(max_attempts)b::int[],
            %(args)b::json[], %(catch_ups)b::float8[])
     AS d(name, schedule, timezone, task, queue, priority, max_attempts, args, catch_up)
ORDER BY d.name
ON CONFLICT (name) DO UPDATE
SET since_at = CASE WHEN p.schedule = excluded.schedule AND p.timezone = excluded.timezone
                    THEN p.since_at ELSE now() END,
    seen_at = CASE WHEN p.schedule = excluded.schedule AND p.timezone = excluded.timezone
                   THEN p.seen_at ELSE now() END,
    next_tick_at = CASE WHEN p.schedule = excluded.schedule AND p.timezone = excluded.timezone
                        THEN p.next_tick_at END,
    schedule = excluded.schedule,
    timezone = excluded.timezone,
    task = excluded.task,
    queue = excluded.queue,
    priority = excluded.priority,
    max_attempts = excluded.max_attempts,
    args = excluded.args,
    catch_up = excluded.catch_up,
    updated_at = now()

-- name: periodic_enqueue_tick
-- One tick, once across the fleet: the UPDATE records the tick only when it
-- is newer than what is recorded and the stored definition is the caller's
-- (name, schedule and time zone: a worker running a replaced definition
-- changes nothing); the INSERT adds the job only if the UPDATE returned the
-- row. One statement, so both commit or neither does. A twin statement for
-- the same tick waits on the row lock, then re-checks the WHERE against the
-- committed row (READ COMMITTED) and finds nothing to do. A job due now is
-- announced on its queue's channel like any enqueue.
WITH tick AS (
    UPDATE jobkeeper_periodic
    SET last_tick_at = %(tick)s, next_tick_at = %(next_tick)s
    WHERE name = %(name)s AND schedule = %(schedule)s AND timezone = %(timezone)s
      AND since_at < %(tick)s
      AND (last_tick_at IS NULL OR last_tick_at < %(tick)s)
    RETURNING task, queue, args, priority, max_attempts
), inserted AS (
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at, serial_unkeyed)
SELECT tick.queue, tick.task, tick.args,
       CASE WHEN %(tick)s::timestamptz > now() THEN 'scheduled' ELSE 'available' END,
       tick.priority, tick.max_attempts, %(tick)s,
       (SELECT true FROM jobkeeper_queues AS settings
        WHERE settings.name = tick.queue AND settings.serial)
FROM tick
RETURNING id, queue, status
)
SELECT id, CASE WHEN status = 'available' THEN pg_notify(%(channel)s, queue) END FROM inserted

-- name: periodic_skip
-- Missed ticks too old for catch_up: not owed any more. Only ever moves
-- since_at forward, and only past ticks nobody has enqueued.
UPDATE jobkeeper_periodic
SET since_at = %(through)s, next_tick_at = %(next_tick)s
WHERE name = %(name)s AND schedule = %(schedule)s AND timezone = %(timezone)s
  AND since_at < %(through)s
  AND (last_tick_at IS NULL OR last_tick_at < %(through)s)
RETURNING name

-- name: periodic_touch
-- Each pass: "a worker registering this definition is alive" (seen_at),
-- only where the stored definition is still the caller's. Rows are locked
-- in name order first (MATERIALIZED, ORDER BY ... FOR UPDATE), so workers
-- touching the same rows at once cannot deadlock.
WITH mine AS MATERIALIZED (
    SELECT p.name, d.next_tick
    FROM jobkeeper_periodic AS p
    JOIN unnest(%(names)b::text[], %(schedules)b::text[], %(timezones)b::text[],
                %(next_ticks)b::timestamptz[]) AS d(name, schedule, timezone, next_tick)
      ON p.name = d.name AND p.schedule = d.schedule AND p.timezone = d.timezone
    ORDER BY p.name
    FOR UPDATE OF p
)
UPDATE jobkeeper_periodic AS p
SET seen_at = greatest(p.seen_at, now()), next_tick_at = mine.next_tick
FROM mine
WHERE p.name = mine.name
RETURNING p.name

-- name: periodic_list
SELECT name, schedule, timezone, task, queue, priority, max_attempts, args, catch_up,
       since_at, last_tick_at, next_tick_at, seen_at,
       seen_at < now() - make_interval(secs => %(stale_after)s::float8) AS stale
FROM jobkeeper_periodic
ORDER BY name

-- name: periodic_prune
-- The stale test is in the DELETE itself: a row a worker refreshes meanwhile stays.
DELETE FROM jobkeeper_periodic
WHERE seen_at < now() - make_interval(secs => %(stale_after)s::float8)
RETURNING name


-- Flow control: per-queue settings (jobkeeper_queues), backpressure, serial keys.

-- name: job_claim_limited
-- The claim of a queue with settings: one round trip to the function the
-- schema defines (0007), which locks the queue's row, counts with fresh
-- snapshots and claims (see its comments).
SELECT {job_columns} FROM jobkeeper_claim_limited(%(queue)s, %(worker_id)s, %(limit)s)

-- name: queue_settings_list
SELECT name, paused, concurrency, rate_limit, rate_period, max_pending, serial
FROM jobkeeper_queues
WHERE %(names)s::text[] IS NULL OR name = ANY(%(names)s::text[])
ORDER BY name

-- name: queue_configure
-- Only the settings given change (each comes with a "set_" flag); the row
-- is created on first use and locked by the upsert, so a concurrent claim of
-- the queue sees either the old settings or the new, never half of them.
INSERT INTO jobkeeper_queues AS q
    (name, paused, concurrency, rate_limit, rate_period, max_pending)
VALUES (%(name)s, coalesce(%(paused)s, false), %(concurrency)s, %(rate_limit)s,
        %(rate_period)s, %(max_pending)s)
ON CONFLICT (name) DO UPDATE
SET paused = CASE WHEN %(set_paused)s THEN excluded.paused ELSE q.paused END,
    concurrency = CASE WHEN %(set_concurrency)s THEN excluded.concurrency ELSE q.concurrency END,
    rate_limit = CASE WHEN %(set_rate)s THEN excluded.rate_limit ELSE q.rate_limit END,
    rate_period = CASE WHEN %(set_rate)s THEN excluded.rate_period ELSE q.rate_period END,
    max_pending = CASE WHEN %(set_max_pending)s THEN excluded.max_pending ELSE q.max_pending END,
    updated_at = now()
RETURNING name, paused, concurrency, rate_limit, rate_period, max_pending, serial

-- name: queue_configure_delete_if_empty
-- A row with nothing set goes, so the queue claims on the fast path again.
-- Its window of claim times goes with its rate limit.
WITH gone AS (
    DELETE FROM jobkeeper_queues
    WHERE name = %(name)s AND NOT paused AND NOT serial AND concurrency IS NULL
      AND rate_limit IS NULL AND max_pending IS NULL
    RETURNING name
)
DELETE FROM jobkeeper_queue_starts
WHERE queue = %(name)s
  AND NOT EXISTS (SELECT 1 FROM jobkeeper_queues WHERE name = %(name)s AND rate_limit IS NOT NULL)

-- name: job_insert_many_mark_serial
-- Before the first serial-keyed job of a queue is inserted (same
-- transaction): its claims must take the serial path from then on. Rows
-- already marked are not touched (no row lock taken). A queue marked now
-- flags its unfinished unkeyed jobs (serial_unkeyed, see
-- 0017_serial_unkeyed_index.sql): this reads the queue's jobs once, in the
-- life of the queue.
WITH marked AS (
INSERT INTO jobkeeper_queues AS q (name, serial)
SELECT wanted.name, true FROM unnest(%(queues)s::text[]) AS wanted(name)
WHERE NOT EXISTS (SELECT 1 FROM jobkeeper_queues AS marked
                  WHERE marked.name = wanted.name AND marked.serial)
ORDER BY wanted.name
ON CONFLICT (name) DO UPDATE SET serial = true
RETURNING q.name
)
UPDATE jobkeeper_jobs AS job SET serial_unkeyed = true
FROM marked
WHERE job.queue = marked.name AND job.serial_key IS NULL AND job.serial_unkeyed IS NULL
  AND job.status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')

-- name: job_insert_many_lock_pending
-- Enqueues into queues with max_pending serialise on the queue's row, so
-- two cannot both pass the check; the count follows in the next statement
-- (job_insert_many_count_pending), whose snapshot is taken after the lock is held.
-- The row is also written (to itself): a caller's REPEATABLE READ or
-- SERIALIZABLE transaction counts in its own snapshot, and a limited enqueue
-- committed since then has left a newer version of the row, which fails it
-- with a serialization error (retry the transaction) where a row only locked
-- would have let it count too few and pass the limit.
-- It also sends one NOTIFY per queue in %(woken)s on %(channel)s: the COPY
-- path's, whose rows go in by no statement that could (the other inserts
-- announce their jobs themselves and pass none); the one-time filter runs
-- once whether or not any queue is limited.
WITH locked AS (
    SELECT name FROM jobkeeper_queues
    WHERE name = ANY(%(queues)s::text[]) AND max_pending IS NOT NULL
    ORDER BY name
    FOR UPDATE
), written AS (
    UPDATE jobkeeper_queues AS q SET max_pending = q.max_pending
    FROM locked WHERE q.name = locked.name
    RETURNING q.name, q.max_pending
)
SELECT name, max_pending FROM written
WHERE (SELECT count(pg_notify(%(channel)s, queue)) FROM unnest(%(woken)s::text[]) AS queue) >= 0

-- name: job_insert_many_count_pending
-- Pending: scheduled, available, claimed or retryable. Counted status by
-- status, each part within a partial index that holds only such rows (claim,
-- due, held): one condition naming all four statuses matches no index, and
-- its plan scanned the whole table, finished rows too (30 ms per enqueue into
-- a limited queue beside 60,000 finished rows, while the queue's row was locked).
SELECT queue, sum(n)::bigint AS n FROM (
    SELECT queue, count(*) AS n FROM jobkeeper_jobs
    WHERE status = 'available' AND queue = ANY(%(queues)s::text[])
    GROUP BY queue
    UNION ALL
    SELECT queue, count(*) FROM jobkeeper_jobs
    WHERE status IN ('scheduled', 'retryable') AND queue = ANY(%(queues)s::text[])
    GROUP BY queue
    UNION ALL
    SELECT queue, count(*) FROM jobkeeper_jobs
    WHERE status = 'claimed' AND queue = ANY(%(queues)s::text[])
    GROUP BY queue
) AS parts
GROUP BY queue

-- name: periodic_enqueue_tick_queue
-- The queue a periodic's tick would go to (its max_pending is checked first).
SELECT queue FROM jobkeeper_periodic WHERE name = %(name)s

-- name: job_mark_awaited
-- A waiter marks the job so that its end is announced (see migration 0006);
-- it then reads the job again, so an end committed before the mark is seen
-- by that read and one committed after it fires the NOTIFY. Writes nothing
-- when already marked.
UPDATE jobkeeper_jobs SET awaited = true WHERE id = %(id)s AND NOT awaited

-- name: notify_done
-- The end of jobs someone waits for (awaited: see job_mark_awaited), sent by
-- the worker right after the write that ended them. Only awaited jobs pay
-- for it: outcome statements return the flag, nothing else is announced.
SELECT pg_notify(%(channel)s, id::text) FROM unnest(%(ids)s::bigint[]) AS id

-- name: installation_get
-- The database's random installation value (migration 0008), read once per
-- worker: it prefixes every idempotency key handed to a task.
SELECT id FROM jobkeeper_installation LIMIT 1

-- name: job_complete_in
-- complete_in(): the running job completed on the caller's connection, in
-- the caller's transaction, fenced on the whole claim as job_complete_many
-- is. River's JobCompleteTx fences on state = 'running' alone, so a holder
-- whose job was rescued and is running again elsewhere would complete it;
-- here no row matches and the caller gets ClaimLost. The UPDATE's row lock
-- is held until the caller's commit or rollback: a rescue or cancel of the
-- job waits for it, then sees the outcome.
UPDATE jobkeeper_jobs AS job
SET status = 'completed', finished_at = now(), worker_id = NULL, result = %(result)s::json,
    run_alone = false
WHERE job.id = %(id)s AND job.worker_id = %(worker_id)s AND job.attempt = %(attempt)s
  AND job.fence = %(fence)s AND job.status IN ('claimed', 'running')
RETURNING job.id, job.awaited

-- name: job_complete_in_delete
-- retention = 0: the job deleted instead, with the same fence.
DELETE FROM jobkeeper_jobs AS job
WHERE job.id = %(id)s AND job.worker_id = %(worker_id)s AND job.attempt = %(attempt)s
  AND job.fence = %(fence)s AND job.status IN ('claimed', 'running')
RETURNING job.id, job.awaited

-- name: job_completed_in
-- Which of a worker's refused outcomes were refused because complete_in had
-- committed: the job is completed at the fence of that claim (no later claim
-- can have taken it, every claim bumps the fence), or, with retention = 0,
-- gone (the caller's job_complete_in_delete).
SELECT wanted.id
FROM unnest(%(ids)b::bigint[], %(fences)b::int8[]) AS wanted(id, fence)
LEFT JOIN jobkeeper_jobs AS job ON job.id = wanted.id
WHERE (job.id IS NULL AND %(delete)s)
   OR (job.status = 'completed' AND job.fence = wanted.fence)
