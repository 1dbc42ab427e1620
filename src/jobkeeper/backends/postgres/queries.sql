-- Every runtime statement of the PostgreSQL backend. A block runs from its
-- "-- name:" line to the next; names equal the PostgresBackend methods.
-- Batched statements take parallel arrays and unnest them, so one round trip
-- carries any number of rows. Arrays travel in binary (%(name)b): psycopg's
-- text-format array quoting cost more than the statement itself in profiles.
-- {utc_now_text} is now() as ISO 8601 text in UTC, the "at" of error entries,
-- whatever the session's TimeZone.

-- name: job_insert_many
-- Rows are inserted in input order (ORDER BY ord), so ids ascend with it.
-- A (task, unique_key) that matches a pending job is skipped here and
-- resolved to that job by job_get_pending_by_unique_key.
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at, unique_key)
SELECT new.queue, new.task, new.args,
       CASE WHEN new.delay IS NOT NULL OR new.run_at > now() THEN 'scheduled'
            ELSE 'available' END,
       new.priority, new.max_attempts,
       CASE WHEN new.delay IS NOT NULL THEN now() + make_interval(secs => new.delay)
            ELSE coalesce(new.run_at, now()) END,
       new.unique_key
FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(args)b::json[], %(priorities)b::int[],
            %(max_attempts)b::int[], %(delays)b::float8[], %(run_ats)b::timestamptz[],
            %(unique_keys)b::text[])
     WITH ORDINALITY AS new(queue, task, args, priority, max_attempts, delay, run_at, unique_key, ord)
ORDER BY new.ord
ON CONFLICT (task, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
    DO NOTHING
RETURNING *

-- name: job_insert_one
-- One job without a unique key (so no conflict is possible): plain
-- parameters plan and travel faster than eight one-element arrays, and the
-- caller builds the Job from its input plus what the server decided.
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at)
VALUES (
    %(queue)s, %(task)s, %(args)s::json,
    CASE WHEN %(delay)s::float8 IS NOT NULL OR %(run_at)s::timestamptz > now()
         THEN 'scheduled' ELSE 'available' END,
    %(priority)s, %(max_attempts)s,
    CASE WHEN %(delay)s::float8 IS NOT NULL THEN now() + make_interval(secs => %(delay)s::float8)
         ELSE coalesce(%(run_at)s::timestamptz, now()) END)
RETURNING id, status, scheduled_at, created_at

-- name: job_reserve_ids
-- The bulk path (COPY) takes its ids up front, ascending, and the
-- transaction's clock, to build the Jobs it returns without a RETURNING.
-- The sequence is looked up once (MATERIALIZED): called per row,
-- pg_get_serial_sequence's catalog lookup cost 3 us a job, more than nextval.
WITH sequence AS MATERIALIZED (
    SELECT pg_get_serial_sequence('jobkeeper_jobs', 'id')::regclass AS id
)
SELECT now(), array_agg(nextval(sequence.id) ORDER BY n)
FROM sequence, generate_series(1, %(count)s) AS n

-- name: job_copy_in
-- Jobs to run now: status, scheduled_at and created_at take their defaults
-- ('available', and now(): the same transaction clock job_reserve_ids read).
COPY jobkeeper_jobs (id, queue, task, args, priority, max_attempts)
FROM STDIN

-- name: job_copy_in_scheduled
COPY jobkeeper_jobs
    (id, queue, task, args, status, priority, max_attempts, scheduled_at, created_at)
FROM STDIN

-- name: job_get_pending_by_unique_key
SELECT job.*
FROM jobkeeper_jobs AS job
JOIN unnest(%(tasks)b::text[], %(unique_keys)b::text[]) AS wanted(task, unique_key)
  ON job.task = wanted.task AND job.unique_key = wanted.unique_key
WHERE job.status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')

-- name: job_claim
-- The candidate ids are MATERIALIZED before the UPDATE uses them: as a plain
-- subquery the planner may re-run the LIMITed, SKIP LOCKED scan and claim
-- more rows than asked. SKIP LOCKED lets many workers claim at once without
-- waiting on each other's row locks.
WITH candidates AS MATERIALIZED (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status = 'available' AND queue = %(queue)s
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
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
FROM candidates
WHERE job.id = candidates.id
-- Only what is not known already (status, holder...), times as UTC wall
-- clock, JSON as text (decoded by one shared decoder; errors only when there
-- are any): the claim is the worker's hottest read (see claimed_job()).
RETURNING job.id, job.queue, job.task, job.args::text, job.priority, job.attempt,
          job.max_attempts, job.scheduled_at AT TIME ZONE 'UTC',
          job.created_at AT TIME ZONE 'UTC', job.attempted_at AT TIME ZONE 'UTC',
          job.unique_key, nullif(job.errors, '[]'::jsonb)::text, job.fence,
          job.unstarted_returns

-- name: job_start_many
-- Start marks: claimed -> running when the task is really called, fenced on
-- the claim. A job whose outcome was written first is left alone.
UPDATE jobkeeper_jobs AS job
SET status = 'running', attempted_at = now()
FROM unnest(%(ids)b::bigint[], %(worker_ids)b::text[], %(attempts)b::int[], %(fences)b::int8[])
     AS started(id, worker_id, attempt, fence)
WHERE job.id = started.id AND job.worker_id = started.worker_id
  AND job.attempt = started.attempt AND job.fence = started.fence AND job.status = 'claimed'
RETURNING job.id

-- name: job_complete_many
-- Fenced on (id, worker_id, attempt, fence): a worker whose claim was
-- rescued or handed back (and perhaps re-claimed, even at the same attempt)
-- writes nothing. A claimed job may complete before its start mark is
-- written (the mark is then skipped). A success stays completed even with a
-- cancel request: the work was done.
UPDATE jobkeeper_jobs AS job
SET status = 'completed', finished_at = now(), worker_id = NULL, result = done.result
FROM unnest(%(ids)b::bigint[], %(worker_ids)b::text[], %(attempts)b::int[],
            %(fences)b::int8[], %(results)b::json[])
     AS done(id, worker_id, attempt, fence, result)
WHERE job.id = done.id AND job.worker_id = done.worker_id AND job.attempt = done.attempt
  AND job.fence = done.fence AND job.status IN ('claimed', 'running')
RETURNING job.id

-- name: job_complete_delete_many
-- retention = 0: completed jobs are deleted at once, with the same fence.
DELETE FROM jobkeeper_jobs AS job
USING unnest(%(ids)b::bigint[], %(worker_ids)b::text[], %(attempts)b::int[],
             %(fences)b::int8[])
     AS done(id, worker_id, attempt, fence)
WHERE job.id = done.id AND job.worker_id = done.worker_id AND job.attempt = done.attempt
  AND job.fence = done.fence AND job.status IN ('claimed', 'running')
RETURNING job.id

-- name: job_fail_many
-- Retryable, cancelled, released and returned outcomes (dead ones move:
-- job_fail_dead_many). "released" hands a job back (shutdown, a stalled
-- prefetch): available at once, and the interrupted attempt is not spent
-- (the error entry records it; a NULL error, for a job handed back
-- unstarted, adds none). "returned" is the rescuer's free return of a job
-- still claimed (never started) by a lost holder: available, attempt given
-- back, counted in unstarted_returns; only while the job is still claimed.
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
                  ELSE failed.outcome END,
    attempt = CASE WHEN failed.outcome IN ('released', 'returned') THEN job.attempt - 1
                   ELSE job.attempt END,
    unstarted_returns = job.unstarted_returns
                        + CASE failed.outcome WHEN 'returned' THEN 1 ELSE 0 END,
    finished_at = CASE WHEN job.cancel_requested THEN now()
                       WHEN failed.outcome IN ('released', 'returned') THEN NULL
                       ELSE now() END,
    scheduled_at = CASE WHEN failed.outcome = 'retryable' AND NOT job.cancel_requested
                        THEN now() + make_interval(secs => failed.retry_in)
                        ELSE job.scheduled_at END,
    worker_id = NULL,
    errors = CASE WHEN failed.error IS NULL THEN job.errors
                  ELSE job.errors || jsonb_build_array(
                           failed.error || jsonb_build_object('at', {utc_now_text})) END
FROM unnest(%(ids)b::bigint[], %(worker_ids)b::text[], %(attempts)b::int[],
            %(fences)b::int8[], %(outcomes)b::text[], %(errors)b::jsonb[],
            %(retry_ins)b::float8[])
     AS failed(id, worker_id, attempt, fence, outcome, error, retry_in)
WHERE job.id = failed.id AND job.worker_id = failed.worker_id AND job.attempt = failed.attempt
  AND job.fence = failed.fence
  AND (job.status = 'claimed' OR (job.status = 'running' AND failed.outcome <> 'returned'))
  AND (%(stale_after)s::float8 IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = job.worker_id
          AND worker.heartbeat_at > now() - make_interval(
                secs => coalesce(worker.rescue_after, %(stale_after)s::float8))))
RETURNING job.id

-- name: job_lock_many
-- Row locks taken before job_fail_dead_many, in id order, in the same
-- transaction: its two branches split on cancel_requested, and a cancel
-- committed between its snapshot and its row locks would otherwise match
-- neither branch. Holding the locks first, its snapshot sees every cancel.
SELECT id FROM jobkeeper_jobs WHERE id = ANY(%(ids)b::bigint[]) ORDER BY id FOR UPDATE

-- name: job_fail_dead_many
-- Moves the job to the dead letters in one statement: the DELETE and the
-- INSERT commit together, so a job is always in exactly one of the tables.
-- A job with a cancel request is not moved: it ends cancelled (the error
-- entry kept), as in job_fail_many.
WITH failed AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(worker_ids)b::text[], %(attempts)b::int[],
                         %(fences)b::int8[], %(errors)b::jsonb[], %(reasons)b::text[])
                  AS failed(id, worker_id, attempt, fence, error, reason)
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
    RETURNING job.id
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
    RETURNING job.*, failed.error AS new_error, failed.reason AS new_reason
), dead AS (
    INSERT INTO jobkeeper_dead_letters
        (id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
         attempted_at, finished_at, unique_key, errors, result, reason)
    SELECT id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
           attempted_at, now(), unique_key,
           errors || jsonb_build_array(new_error || jsonb_build_object('at', {utc_now_text})),
           result, new_reason
    FROM moved
    RETURNING id
)
SELECT id FROM dead
UNION ALL
SELECT id FROM cancelled

-- name: job_stage_due
-- Due scheduled/retryable jobs become available; one NOTIFY per queue
-- that received any. SKIP LOCKED: stagers of several workers split the work.
WITH due AS (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status IN ('scheduled', 'retryable') AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), staged AS (
    UPDATE jobkeeper_jobs AS job
    SET status = 'available'
    FROM due
    WHERE job.id = due.id
    RETURNING job.queue
)
SELECT per_queue.queue, per_queue.staged, pg_notify(%(channel)s, per_queue.queue)
FROM (SELECT queue, count(*) AS staged FROM staged GROUP BY queue) AS per_queue

-- name: job_next_due_in
-- 0 while any job of these queues is available (a claim that came back empty
-- is not proof the queue is: burst mode must not stop on it).
SELECT CASE
    WHEN EXISTS (SELECT 1 FROM jobkeeper_jobs
                 WHERE status = 'available' AND queue = ANY(%(queues)b::text[])) THEN 0
    ELSE (SELECT extract(epoch FROM min(scheduled_at) - now())::float8
          FROM jobkeeper_jobs
          WHERE status IN ('scheduled', 'retryable') AND queue = ANY(%(queues)b::text[]))
END

-- name: job_rescue_candidates
-- Held jobs (claimed or running) of silent holders. Rescue does not depend on the holder's worker row existing: a job whose
-- holder was pruned is as orphaned as one whose holder went silent
-- (procrastinate#1518). A holder is silent once its heartbeat is older than
-- its own declared rescue_after (else %(rescue_after)s, the rescuer's window
-- for holders that declared none): a rescuer with a shorter window than a
-- live holder's must not take its jobs.
SELECT job.*
FROM jobkeeper_jobs AS job
WHERE job.status IN ('claimed', 'running')
  AND NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = job.worker_id
          AND worker.heartbeat_at > now() - make_interval(
                secs => coalesce(worker.rescue_after, %(rescue_after)s::float8)))
ORDER BY job.id
LIMIT %(limit)s

-- name: job_cancel_requested
SELECT id, worker_id, attempt, fence
FROM jobkeeper_jobs
WHERE worker_id = %(worker_id)s AND status IN ('claimed', 'running') AND cancel_requested

-- name: job_held_by
SELECT *
FROM jobkeeper_jobs
WHERE worker_id = %(worker_id)s AND status IN ('claimed', 'running')

-- name: job_prune_finished
WITH expired AS (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status IN ('completed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(older_than)s::float8)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobkeeper_jobs AS job
USING expired
WHERE job.id = expired.id

-- name: job_table_vacuum
-- Only when the server has autovacuum off (see the pruner). SKIP_LOCKED: if
-- another worker's pruner is already vacuuming, this one moves on.
VACUUM (SKIP_LOCKED, ANALYZE) jobkeeper_jobs

-- name: job_table_analyze
ANALYZE (SKIP_LOCKED) jobkeeper_jobs

-- name: job_table_stats
-- Rows changed since the last ANALYZE, live rows, and whether the table was
-- ever analyzed (by anyone).
SELECT coalesce(n_mod_since_analyze, 0), coalesce(n_live_tup, 0),
       last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL,
       current_setting('autovacuum') = 'on'
FROM pg_stat_user_tables
WHERE relid = 'jobkeeper_jobs'::regclass

-- name: job_get
SELECT * FROM jobkeeper_jobs WHERE id = %(id)s

-- name: dead_letter_get
SELECT * FROM jobkeeper_dead_letters WHERE id = %(id)s

-- name: job_list
SELECT *
FROM jobkeeper_jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY id DESC
LIMIT %(limit)s

-- name: dead_letter_list
SELECT *
FROM jobkeeper_dead_letters
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_cancel
-- Pending jobs are cancelled at once; a held (claimed or running) job is
-- flagged and its worker (or the rescuer, if the worker is gone) finishes
-- the cancellation: whatever outcome it writes next but a success becomes
-- cancelled (see job_fail_many).
UPDATE jobkeeper_jobs
SET status = CASE WHEN status IN ('claimed', 'running') THEN status ELSE 'cancelled' END,
    finished_at = CASE WHEN status IN ('claimed', 'running') THEN finished_at ELSE now() END,
    cancel_requested = true
WHERE id = %(id)s AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
RETURNING *

-- name: job_retry
UPDATE jobkeeper_jobs
SET status = 'available', attempt = 0, unstarted_returns = 0, scheduled_at = now(),
    finished_at = NULL, cancel_requested = false
WHERE id = %(id)s AND status IN ('retryable', 'cancelled', 'completed')
RETURNING *

-- name: dead_letter_requeue
-- Back to the jobs table with the same id, attempts reset, history kept.
WITH revived AS (
    DELETE FROM jobkeeper_dead_letters
    WHERE %(all)s OR id = ANY(%(ids)b::bigint[])
    RETURNING *
)
INSERT INTO jobkeeper_jobs
    (id, queue, task, args, status, priority, attempt, max_attempts, scheduled_at,
     created_at, attempted_at, finished_at, unique_key, errors, result)
SELECT id, queue, task, args, 'available', priority, 0, max_attempts, now(),
       created_at, attempted_at, NULL, unique_key, errors, result
FROM revived
RETURNING id

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
INSERT INTO jobkeeper_workers (id, hostname, pid, queues, started_at, heartbeat_at, rescue_after)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s::jsonb, now(), now(), %(rescue_after)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()

-- name: worker_heartbeat
UPDATE jobkeeper_workers SET heartbeat_at = now() WHERE id = %(id)s

-- name: worker_deregister
DELETE FROM jobkeeper_workers WHERE id = %(id)s

-- name: worker_prune_stale
-- Never a row whose worker may still be alive by its own rescue_after: its
-- jobs would become rescuable with it.
DELETE FROM jobkeeper_workers
WHERE heartbeat_at < now() - make_interval(
          secs => greatest(%(older_than)s::float8, 2 * coalesce(rescue_after, 0)))

-- name: worker_list
SELECT id, hostname, pid, queues, started_at, heartbeat_at, rescue_after
FROM jobkeeper_workers
ORDER BY started_at

-- name: notify_queues
SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)b::text[]) AS queue

-- name: db_now
SELECT now()

-- name: schema_version
SELECT coalesce(max(version), 0) FROM jobkeeper_schema
