-- Every runtime statement of the SQLite backend. A block runs from its
-- "-- name:" line to the next; names equal the SqliteBackend methods.
-- {now} is the database clock: julianday('now') as Unix seconds (UTC), the
-- same value for every row of one statement. {clock} is {now}, or the
-- caller's :now (Unix seconds) when it pinned the time (the time-dependent
-- operations' now=).
-- {errors_plus_new} appends :error to the errors array, tolerating a
-- corrupted errors column (a failure must always be recordable).
-- {serial_unkeyed} is the serial_unkeyed flag of a new job without a serial
-- key in the queue named by :queue (see 0017_serial_unkeyed_index.sql): 1 in
-- a serial queue, else NULL.
-- {serial_takeable} holds for the serial claim's row "job" that it may take:
-- unkeyed, or its key's first available job in :queue, the key neither in
-- :held (a JSON array) nor held in any queue.

-- name: job_insert_many
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at, created_at, unique_key,
     serial_key, trace_context, serial_unkeyed)
VALUES (
    :queue, :task, :args,
    CASE WHEN :delay IS NOT NULL OR :run_at > {now} THEN 'scheduled' ELSE 'available' END,
    :priority, :max_attempts,
    CASE WHEN :delay IS NOT NULL THEN {now} + :delay ELSE coalesce(:run_at, {now}) END,
    {now}, :unique_key, :serial_key, :trace_context,
    CASE WHEN :serial_key IS NULL THEN {serial_unkeyed} END)
ON CONFLICT (task, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
    DO NOTHING
RETURNING *

-- name: job_insert_many_bulk
-- enqueue_many without unique keys: status and times computed by the caller
-- from one {now} read in the same transaction. The serial_unkeyed flag is
-- looked up for the row's queue (its 10th parameter, the queue again) by a
-- primary-key probe of a small table, inside the INSERT: a read of the
-- serial queues first, on a caller's deferred transaction, would let another
-- writer in before our write lock. Plain ? placeholders, not ?1 twice: a
-- sequence bound to numbered ones is misread as named on Python 3.12.0-3.12.3
-- (a DeprecationWarning per call, an error under -W error; CPython gh-117995).
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at, created_at, trace_context,
     serial_unkeyed)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?,
        (SELECT 1 FROM jobkeeper_queues AS settings WHERE settings.name = ? AND settings.serial))

-- name: job_insert_many_pending
SELECT *
FROM jobkeeper_jobs
WHERE task = :task AND unique_key = :unique_key
  AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')

-- name: job_insert_many_last_id
-- The id of the bulk path's last row: its ids are consecutive (the write lock
-- is held from the first insert, and AUTOINCREMENT takes max + 1).
SELECT last_insert_rowid()

-- name: job_insert_many_same_database
-- The files a caller's connection= has attached ("main" is its database),
-- so that jobs are never inserted into another file than the queue's.
PRAGMA database_list

-- name: connection_journal_wal
-- Each new connection: write-ahead logging, so readers never block the writer.
PRAGMA journal_mode = WAL

-- name: connection_synchronous_full
-- Each new connection: every commit is on disk before it returns.
PRAGMA synchronous = FULL

-- name: connection_journal_size_limit
-- Each new connection: once a checkpoint has caught up, a WAL file grown
-- past 16 MiB (a long reader held checkpoints back) is cut back to 16 MiB.
-- Without it the file kept its largest size while any process had the
-- database open: 89.6 MB after a reader had closed, 510 MB during one.
PRAGMA journal_size_limit = 16777216

-- name: connection_synchronous_normal
-- For one write whose loss on a power cut is harmless (a claim: see
-- SqliteConnection._write); connection_synchronous_full follows it.
PRAGMA synchronous = NORMAL

-- name: connection_busy_timeout
-- How long SQLite's busy handler waits for a lock: a short slice while a
-- write asks for the write lock, busy_timeout otherwise (ms: milliseconds).
PRAGMA busy_timeout = {ms}

-- name: job_claim
-- Runs inside BEGIN IMMEDIATE, on the ids job_claim_pick (or the serial claim)
-- chose there: the write lock is taken before the read, so two workers can
-- never pick the same rows. The job is 'claimed', not yet 'running' (its start
-- mark, job_start_many, says when the task is called); the attempt is counted
-- here and fence numbers the claim. Pick, update and read back
-- (job_claim_rows) rather than one UPDATE ... RETURNING: the temporary table
-- SQLite fills for RETURNING took up to 0.25 ms of a one-job claim (its
-- memory given back to the system and faulted in again at every claim).
UPDATE jobkeeper_jobs
SET status = 'claimed', attempt = attempt + 1, fence = fence + 1, attempted_at = {now},
    finished_at = NULL, worker_id = :worker_id
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'available'

-- name: job_claim_pick
-- The jobs a claim takes, in claim order (see job_claim).
SELECT id
FROM jobkeeper_jobs
WHERE status = 'available' AND queue = :queue
ORDER BY priority, scheduled_at, id
LIMIT :limit

-- name: job_claim_rows
-- The claimed jobs as job_claim left them.
SELECT *
FROM jobkeeper_jobs
WHERE id IN (SELECT value FROM json_each(:ids))

-- name: job_claim_one
-- job_claim of a single job (the common case of a worker woken for one
-- enqueue): by its primary key, without the JSON list.
UPDATE jobkeeper_jobs
SET status = 'claimed', attempt = attempt + 1, fence = fence + 1, attempted_at = {now},
    finished_at = NULL, worker_id = :worker_id
WHERE id = :id AND status = 'available'

-- name: job_claim_one_row
SELECT *
FROM jobkeeper_jobs
WHERE id = :id

-- name: job_claim_probe
-- The *_probe reads run before a periodic write and outside any transaction:
-- a WAL reader takes no lock, so an idle worker's polls neither wait behind
-- other processes' writes nor hold up theirs (heartbeats above all: CPU-bound
-- tasks slow every Python step of a lock holder, stretching each hold). A
-- probe that misses a row committed a moment later defers it to the next poll.
-- Each has its write's WHERE and uses its index (the claim probe keeps the
-- claim's ORDER BY: as EXISTS (...), SQLite scanned the whole table).
SELECT 1
FROM jobkeeper_jobs
WHERE status = 'available' AND queue = :queue
ORDER BY priority, scheduled_at, id
LIMIT 1

-- name: queues_with_available
-- A worker's many queues asked in one read (see the PostgreSQL twin), the
-- names as one JSON array so that thousands stay one parameter. Each probe
-- keeps job_claim_probe's ORDER BY ... LIMIT 1, which SQLite answers from the
-- claim index (as EXISTS it scanned the table).
SELECT wanted.value
FROM json_each(:queues) AS wanted
WHERE (SELECT 1
       FROM jobkeeper_jobs AS job
       WHERE job.status = 'available' AND job.queue = wanted.value
       ORDER BY job.priority, job.scheduled_at, job.id
       LIMIT 1) IS NOT NULL
ORDER BY wanted.key

-- name: job_start_many
-- A start mark: claimed -> running when the task is really called, fenced.
UPDATE jobkeeper_jobs
SET status = 'running', attempted_at = {now}
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status = 'claimed'

-- name: job_start_alone
-- The start mark of a run_alone job started alone; records the claim's
-- fence in alone_fence (see the PostgreSQL twin).
UPDATE jobkeeper_jobs
SET status = 'running', attempted_at = {now}, alone_fence = fence
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status = 'claimed'
RETURNING id

-- name: job_abandon_many
-- A stopping worker gives up on an attempt whose code did not return: no
-- crash pinned on it (see the PostgreSQL twin).
UPDATE jobkeeper_jobs
SET alone_fence = NULL
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence

-- name: job_complete_many
-- Fenced on (id, worker_id, attempt, fence): a worker that lost its claim
-- (rescued, handed back, perhaps re-claimed at the same attempt) writes
-- nothing. A success stays completed even with a cancel request.
UPDATE jobkeeper_jobs
SET status = 'completed', finished_at = {now}, worker_id = NULL, result = :result,
    run_alone = 0
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status IN ('claimed', 'running')

-- name: job_complete_many_delete
DELETE FROM jobkeeper_jobs
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status IN ('claimed', 'running')

-- name: job_fail_many
-- Retryable, cancelled, released or returned (see the PostgreSQL twin:
-- "released" is a hand-back by the holder, "returned" the rescuer's free
-- return of a job still claimed; both give the attempt back, and a NULL
-- :error adds no entry to errors; "snoozed" goes back to scheduled at
-- now + :retry_in, the attempt given back, no entry). A cancel request wins
-- over every outcome here: the job ends cancelled, the error entry kept.
-- :stale_after is the rescuer's re-check that the holder is still silent
-- (for longer than the holder's own rescue_after when it declared one).
UPDATE jobkeeper_jobs
SET status = CASE WHEN cancel_requested THEN 'cancelled'
                  WHEN :outcome IN ('released', 'returned') THEN 'available'
                  WHEN :outcome = 'snoozed' THEN 'scheduled'
                  ELSE :outcome END,
    attempt = CASE WHEN :outcome IN ('released', 'returned', 'snoozed') THEN attempt - 1
                   ELSE attempt END,
    unstarted_returns = unstarted_returns + CASE :outcome WHEN 'returned' THEN 1 ELSE 0 END,
    finished_at = CASE WHEN cancel_requested THEN {now}
                       WHEN :outcome IN ('released', 'returned', 'snoozed') THEN NULL
                       ELSE {now} END,
    scheduled_at = CASE WHEN :outcome IN ('retryable', 'snoozed') AND NOT cancel_requested
                        THEN {now} + :retry_in ELSE scheduled_at END,
    worker_id = NULL,
    errors = CASE WHEN :error IS NULL THEN errors ELSE {errors_plus_new} END,
    -- The crash budget (see the PostgreSQL twin).
    run_alone = CASE WHEN :suspect THEN 1
                     WHEN :outcome IN ('released', 'returned') THEN run_alone
                     ELSE 0 END,
    crashes = crashes + :crash
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND (status = 'claimed' OR (status = 'running' AND :outcome <> 'returned'))
  AND (:stale_after IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = jobkeeper_jobs.worker_id
          AND worker.heartbeat_at > {now} - coalesce(worker.rescue_after, :stale_after)))

-- name: job_fail_many_dead_cancelled
-- A job bound for the dead letters that has a cancel request ends cancelled
-- instead (the error entry kept); tried first, in the same transaction as
-- the move (job_fail_many_dead, job_fail_many_dead_delete) when it changes nothing.
UPDATE jobkeeper_jobs
SET status = 'cancelled', finished_at = {now}, worker_id = NULL, errors = {errors_plus_new}
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status IN ('claimed', 'running') AND cancel_requested
  AND (:stale_after IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = jobkeeper_jobs.worker_id
          AND worker.heartbeat_at > {now} - coalesce(worker.rescue_after, :stale_after)))

-- name: job_fail_many_dead
-- First half of the move to the dead letters; job_fail_many_dead_delete is the
-- second, in the same transaction.
INSERT INTO jobkeeper_dead_letters
    (id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
     attempted_at, finished_at, unique_key, errors, result, reason, serial_key, crashes, fence)
SELECT id, queue, task, args, priority, attempt, max_attempts, scheduled_at, created_at,
       attempted_at, {now}, unique_key, {errors_plus_new}, result, :reason, serial_key,
       crashes + :crash, fence
FROM jobkeeper_jobs
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status IN ('claimed', 'running') AND NOT cancel_requested
  AND (:stale_after IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = jobkeeper_jobs.worker_id
          AND worker.heartbeat_at > {now} - coalesce(worker.rescue_after, :stale_after)))

-- name: job_fail_many_dead_delete
DELETE FROM jobkeeper_jobs WHERE id = :id

-- name: job_stage_due
UPDATE jobkeeper_jobs
SET status = 'available'
WHERE id IN (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status IN ('scheduled', 'retryable') AND scheduled_at <= {clock}
    ORDER BY scheduled_at
    LIMIT :limit)

-- name: job_stage_due_probe
-- A lock-free read before job_stage_due takes the write lock: whether any
-- job is due, and when the next job of the caller's queues that is not yet
-- due comes due (seconds, by this clock), so an idle worker can wake for it
-- instead of waiting out poll_interval. Both walk the stager's index
-- (scheduled_at) from now; SQLite's 'now' is one instant per statement.
SELECT (SELECT 1
        FROM jobkeeper_jobs
        WHERE status IN ('scheduled', 'retryable') AND scheduled_at <= {clock}
        LIMIT 1) AS due,
       (SELECT min(scheduled_at) - {clock}
        FROM jobkeeper_jobs
        WHERE status IN ('scheduled', 'retryable') AND scheduled_at > {clock}
          AND queue IN (SELECT value FROM json_each(:queues))) AS next_due_in

-- name: job_next_due_in
-- Seconds until a job of these queues could be claimed, NULL when none could
-- before a queue is resumed or a held job ends (see the PostgreSQL twin).
WITH open AS (
    SELECT served.value AS name, settings.rate_limit, settings.rate_period
    FROM json_each(:queues) AS served
    LEFT JOIN jobkeeper_queues AS settings ON settings.name = served.value
    WHERE NOT coalesce(settings.paused, 0)
      AND (settings.concurrency IS NULL OR settings.concurrency > (
            SELECT count(*) FROM jobkeeper_jobs AS held
            WHERE held.queue = served.value AND held.status IN ('claimed', 'running')))
      AND EXISTS (
            SELECT 1 FROM jobkeeper_jobs AS job
            WHERE job.status = 'available' AND job.queue = served.value
              AND (job.serial_key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM jobkeeper_jobs AS holder
                    WHERE holder.serial_key = job.serial_key
                      AND holder.status IN ('claimed', 'running'))))
), ready AS (
    SELECT CASE WHEN open.rate_limit IS NULL THEN 0 ELSE (
        SELECT CASE WHEN coalesce(sum(starts.jobs), 0) < open.rate_limit THEN 0
                    ELSE min(starts.started_at) + open.rate_period - {clock} END
        FROM jobkeeper_queue_starts AS starts
        WHERE starts.queue = open.name AND starts.started_at > {clock} - open.rate_period)
    END AS due_in
    FROM open
), next AS (
    SELECT (SELECT min(due_in) FROM ready) AS available,
           (SELECT min(scheduled_at) - {clock}
            FROM jobkeeper_jobs
            WHERE status IN ('scheduled', 'retryable')
              AND queue IN (SELECT value FROM json_each(:queues))) AS scheduled
)
SELECT CASE WHEN available IS NULL THEN scheduled
            WHEN scheduled IS NULL THEN available
            ELSE min(available, scheduled) END
FROM next

-- name: job_rescue_candidates
-- Held jobs (claimed or running) of silent holders. Rescue does not depend on the holder's worker row existing (procrastinate#1518).
-- A holder is silent once its heartbeat is older than its own declared
-- rescue_after (else :rescue_after, the rescuer's window for holders that
-- declared none).
SELECT job.*
FROM jobkeeper_jobs AS job
WHERE job.status IN ('claimed', 'running')
  AND NOT EXISTS (
        SELECT 1 FROM jobkeeper_workers AS worker
        WHERE worker.id = job.worker_id
          AND worker.heartbeat_at > {clock} - coalesce(worker.rescue_after, :rescue_after))
ORDER BY job.id
LIMIT :limit

-- name: job_cancel_requested
SELECT id, worker_id, attempt, fence
FROM jobkeeper_jobs
WHERE worker_id = :worker_id AND status IN ('claimed', 'running') AND cancel_requested

-- name: job_held_by
SELECT *
FROM jobkeeper_jobs
WHERE worker_id = :worker_id AND status IN ('claimed', 'running')

-- name: job_confirm_holds
-- As job_held_by: a rescue judges and writes under the database's one write
-- lock, which the holder's fresh beat waited for, so none is in flight.
SELECT *
FROM jobkeeper_jobs
WHERE worker_id = :worker_id AND status IN ('claimed', 'running')

-- name: job_prune_finished
DELETE FROM jobkeeper_jobs
WHERE id IN (
    SELECT id
    FROM jobkeeper_jobs
    WHERE status IN ('completed', 'cancelled') AND finished_at < {clock} - :older_than
    LIMIT :limit)

-- name: job_prune_finished_probe
SELECT 1
FROM jobkeeper_jobs
WHERE status IN ('completed', 'cancelled') AND finished_at < {clock} - :older_than
LIMIT 1

-- name: job_get
SELECT * FROM jobkeeper_jobs WHERE id = :id

-- name: job_get_dead_letter
SELECT * FROM jobkeeper_dead_letters WHERE id = :id

-- name: job_list
SELECT *
FROM jobkeeper_jobs
WHERE (:status IS NULL OR status = :status) AND (:queue IS NULL OR queue = :queue)
  AND (:task IS NULL OR task = :task)
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  -- Keyset paging (see the PostgreSQL twin).
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: job_list_dead_letters
SELECT *
FROM jobkeeper_dead_letters
WHERE (:queue IS NULL OR queue = :queue) AND (:task IS NULL OR task = :task)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: job_list_ids
-- One statement, one snapshot of both tables (see the PostgreSQL twin);
-- :statuses is a JSON array.
SELECT id, status FROM (
    SELECT * FROM (
        SELECT id, status
        FROM jobkeeper_jobs
        WHERE status IN (SELECT value FROM json_each(:statuses))
          AND (:queue IS NULL OR queue = :queue) AND (:task IS NULL OR task = :task)
          AND (:before IS NULL OR id < :before)
        ORDER BY id DESC
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT id, 'dead' AS status
        FROM jobkeeper_dead_letters
        WHERE 'dead' IN (SELECT value FROM json_each(:statuses))
          AND (:queue IS NULL OR queue = :queue) AND (:task IS NULL OR task = :task)
          AND (:before IS NULL OR id < :before)
        ORDER BY id DESC
        LIMIT :limit))
ORDER BY id DESC
LIMIT :limit

-- name: job_cancel
-- Pending jobs are cancelled at once; a held (claimed or running) job is
-- flagged and its worker (or the rescuer, if the worker is gone) finishes
-- the cancellation (see job_fail_many). The jobs of :ids, a JSON array:
-- one, or many (a filtered `jobkeeper cancel`).
UPDATE jobkeeper_jobs
SET status = CASE WHEN status IN ('claimed', 'running') THEN status ELSE 'cancelled' END,
    finished_at = CASE WHEN status IN ('claimed', 'running') THEN finished_at ELSE {now} END,
    cancel_requested = 1
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')
RETURNING *

-- name: job_retry
-- Attempts and the crash budget start afresh; flagged as a new job would be,
-- and only from :statuses (a JSON array; see the PostgreSQL twin).
UPDATE jobkeeper_jobs
SET status = 'available', attempt = 0, unstarted_returns = 0, crashes = 0, scheduled_at = {now},
    finished_at = NULL, cancel_requested = 0,
    serial_unkeyed = CASE WHEN serial_key IS NULL THEN (
        SELECT 1 FROM jobkeeper_queues AS settings
        WHERE settings.name = jobkeeper_jobs.queue AND settings.serial) END
WHERE id = :id AND status IN (SELECT value FROM json_each(:statuses))
  AND (:fence IS NULL OR fence = :fence)
RETURNING *

-- name: job_retry_many
-- job_retry of each job of :ids (a JSON array) in turn, the newest first,
-- without a fence: the ids retried. A cancelled or completed job whose
-- unique_key a pending job of its task holds, or a newer one of :ids takes
-- first, is left out (see the PostgreSQL twin). The holders' lookup names
-- the unique index's statuses as the index does, so that it reads that index.
WITH candidate AS (
    SELECT id, task, unique_key, status
    FROM jobkeeper_jobs
    WHERE id IN (SELECT value FROM json_each(:ids))
      AND status IN (SELECT value FROM json_each(:statuses))
), keyed AS (
    SELECT id, task, unique_key,
           row_number() OVER (PARTITION BY task, unique_key ORDER BY id DESC) AS turn
    FROM candidate
    WHERE unique_key IS NOT NULL AND status IN ('cancelled', 'completed')
)
UPDATE jobkeeper_jobs
SET status = 'available', attempt = 0, unstarted_returns = 0, crashes = 0, scheduled_at = {now},
    finished_at = NULL, cancel_requested = 0,
    serial_unkeyed = CASE WHEN serial_key IS NULL THEN (
        SELECT 1 FROM jobkeeper_queues AS settings
        WHERE settings.name = jobkeeper_jobs.queue AND settings.serial) END
WHERE id IN (
    SELECT id FROM candidate
    WHERE unique_key IS NULL OR status NOT IN ('cancelled', 'completed')
    UNION ALL
    SELECT id FROM keyed
    WHERE turn = 1 AND NOT EXISTS (
        SELECT 1 FROM jobkeeper_jobs AS holder
        WHERE holder.task = keyed.task AND holder.unique_key = keyed.unique_key
          AND holder.unique_key IS NOT NULL
          AND holder.status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')))
RETURNING id

-- name: dead_letter_requeue
-- Back to the jobs table with the same id, attempts reset, history kept;
-- dead_letter_requeue_delete follows in the same transaction. Flagged as a
-- new job would be. The fence goes on from the dead letter's, never back
-- (see the PostgreSQL twin).
INSERT INTO jobkeeper_jobs
    (id, queue, task, args, status, priority, attempt, max_attempts, scheduled_at,
     created_at, attempted_at, finished_at, unique_key, errors, result, serial_key,
     serial_unkeyed, fence)
SELECT id, queue, task, args, 'available', priority, 0, max_attempts, {now},
       created_at, attempted_at, NULL, unique_key, errors, result, serial_key,
       CASE WHEN serial_key IS NULL THEN (
           SELECT 1 FROM jobkeeper_queues AS settings
           WHERE settings.name = dead.queue AND settings.serial) END,
       max(fence, attempt, CASE WHEN NOT json_valid(errors) THEN 0
                                WHEN json_type(errors) = 'array' THEN json_array_length(errors)
                                ELSE 0 END)
FROM jobkeeper_dead_letters AS dead
WHERE :all OR id IN (SELECT value FROM json_each(:ids))
RETURNING id

-- name: dead_letter_requeue_delete
DELETE FROM jobkeeper_dead_letters WHERE id IN (SELECT value FROM json_each(:ids))

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
WHERE dead.unique_key IS NOT NULL AND (:all OR dead.id IN (SELECT value FROM json_each(:ids)))
ORDER BY dead.id

-- name: queue_stats
SELECT queue, status, count(*) FROM jobkeeper_jobs GROUP BY queue, status
UNION ALL
SELECT queue, 'dead', count(*) FROM jobkeeper_dead_letters GROUP BY queue

-- name: worker_register
INSERT INTO jobkeeper_workers
    (id, hostname, pid, queues, started_at, heartbeat_at, rescue_after, version)
VALUES (:id, :hostname, :pid, :queues, {now}, {now}, :rescue_after, :version)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = {now}

-- name: worker_heartbeat
UPDATE jobkeeper_workers SET heartbeat_at = {now} WHERE id = :id

-- name: worker_deregister
DELETE FROM jobkeeper_workers WHERE id = :id

-- name: worker_prune_stale
-- Never a row whose worker may still be alive by its own rescue_after.
DELETE FROM jobkeeper_workers
WHERE heartbeat_at < {clock} - max(:older_than, 2 * coalesce(rescue_after, 0))

-- name: worker_prune_stale_probe
SELECT 1 FROM jobkeeper_workers
WHERE heartbeat_at < {clock} - max(:older_than, 2 * coalesce(rescue_after, 0)) LIMIT 1

-- name: worker_list
SELECT id, hostname, pid, queues, started_at, heartbeat_at, rescue_after, version
FROM jobkeeper_workers
ORDER BY started_at

-- name: db_now
SELECT {now}

-- name: schema_create
CREATE TABLE IF NOT EXISTS jobkeeper_schema (
    version    INTEGER PRIMARY KEY,
    applied_at REAL    NOT NULL
)

-- name: schema_tables_exist
-- As PostgreSQL's: the record of versions applied, and the jobs table.
SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobkeeper_schema'),
       EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobkeeper_jobs')

-- name: schema_version
SELECT coalesce(max(version), 0) FROM jobkeeper_schema

-- name: schema_record
INSERT INTO jobkeeper_schema (version, applied_at) VALUES (?, {now})

-- name: leader_try_acquire
-- Take the lease when it is free or expired, or extend it when it is ours;
-- a row comes back only then (the database clock judges expiry).
INSERT INTO jobkeeper_leader AS leader (name, worker_id, elected_at, expires_at)
VALUES (:name, :worker_id, {clock}, {clock} + :ttl)
ON CONFLICT (name) DO UPDATE
SET worker_id = excluded.worker_id,
    elected_at = CASE WHEN leader.worker_id = excluded.worker_id THEN leader.elected_at
                      ELSE {clock} END,
    expires_at = excluded.expires_at
WHERE leader.worker_id = excluded.worker_id OR leader.expires_at < {clock}
RETURNING worker_id

-- name: leader_resign
DELETE FROM jobkeeper_leader WHERE name = :name AND worker_id = :worker_id

-- name: leader_get
SELECT worker_id FROM jobkeeper_leader WHERE name = :name AND expires_at >= {now}

-- Reads and actions of the dashboard, /metrics and doctor (see the
-- PostgreSQL twins): each reads through a partial index or stops at a cap.

-- name: dead_letter_purge
DELETE FROM jobkeeper_dead_letters
WHERE (:all_ids OR id IN (SELECT value FROM json_each(:ids)))
  AND (:older_than IS NULL OR finished_at < {now} - :older_than)
RETURNING id


-- name: queue_remove_jobs
-- jobkeeper verify's clean-up of its own queue (one transaction, all steps).
DELETE FROM jobkeeper_jobs WHERE queue = :queue

-- name: queue_remove_dead_letters
DELETE FROM jobkeeper_dead_letters WHERE queue = :queue

-- name: queue_remove_settings
DELETE FROM jobkeeper_queues WHERE name = :queue

-- name: queue_remove_starts
DELETE FROM jobkeeper_queue_starts WHERE queue = :queue

-- name: queue_remove_periodic
DELETE FROM jobkeeper_periodic WHERE queue = :queue

-- name: dead_letter_prune
-- The pruner's pass under dead_retention, a batch at a time.
DELETE FROM jobkeeper_dead_letters
WHERE id IN (
    SELECT id
    FROM jobkeeper_dead_letters
    WHERE finished_at < {clock} - :older_than
    LIMIT :limit)

-- name: job_serial_holders
SELECT id FROM jobkeeper_jobs
WHERE serial_key = :serial_key AND status IN ('claimed', 'running')
ORDER BY id

-- name: queue_starts_count
SELECT coalesce(sum(jobs), 0) AS n
FROM jobkeeper_queue_starts
WHERE queue = :queue AND started_at > {now} - :period

-- name: job_throughput
SELECT CAST(finished_at / :bucket AS INTEGER) AS bucket, status, count(*) AS n
FROM jobkeeper_jobs
WHERE status IN ('completed', 'cancelled') AND finished_at >= :from
GROUP BY 1, 2

-- name: queue_oldest_due
-- See the PostgreSQL twin: the first job of each (queue, priority) down the
-- claim index, two probes per pair (300 ms at 600,000 available when it
-- grouped them all through a temporary B-tree), then the due jobs not
-- staged yet. A recursive CTE may name itself only once, in its FROM: each
-- step joins the next pair's first job by id.
WITH RECURSIVE pair(queue, priority, scheduled_at, id, n) AS (
    SELECT * FROM (
        SELECT queue, priority, scheduled_at, id, 1 FROM jobkeeper_jobs
        WHERE status = 'available'
        ORDER BY queue, priority, scheduled_at, id
        LIMIT 1)
    UNION ALL
    SELECT next.queue, next.priority, next.scheduled_at, next.id, pair.n + 1
    FROM pair
    JOIN jobkeeper_jobs AS next ON next.id = coalesce(
        (SELECT id FROM jobkeeper_jobs
         WHERE status = 'available' AND queue = pair.queue AND priority > pair.priority
         ORDER BY priority, scheduled_at, id
         LIMIT 1),
        (SELECT id FROM jobkeeper_jobs
         WHERE status = 'available' AND queue > pair.queue
         ORDER BY queue, priority, scheduled_at, id
         LIMIT 1))
    WHERE pair.n <= :pairs
)
SELECT 1 AS walked, queue, id, scheduled_at AS at, {now} - scheduled_at AS age FROM pair
UNION ALL
-- The smallest id among a queue's oldest, as on PostgreSQL (a bare id beside
-- min() is the first such row SQLite meets, not the smallest).
SELECT 0, late.queue,
       (SELECT min(id) FROM jobkeeper_jobs
        WHERE status IN ('scheduled', 'retryable') AND scheduled_at = late.at
          AND queue = late.queue),
       late.at, {now} - late.at
FROM (SELECT queue, min(scheduled_at) AS at FROM jobkeeper_jobs
      WHERE status IN ('scheduled', 'retryable') AND scheduled_at <= {now}
      GROUP BY queue) AS late

-- name: queue_oldest_due_spread
-- See the PostgreSQL twin. Grouped in the claim index's order (by queue):
-- every available job, but no temporary B-tree; then the smallest id at
-- that time (a bare id beside min() is the first row SQLite meets: with
-- ties, the one of the lowest priority).
SELECT spread.queue,
       (SELECT min(id) FROM jobkeeper_jobs
        WHERE status = 'available' AND queue = spread.queue AND scheduled_at = spread.at) AS id,
       spread.at, {now} - spread.at AS age
FROM (SELECT queue, min(scheduled_at) AS at FROM jobkeeper_jobs
      WHERE status = 'available'
      GROUP BY queue) AS spread

-- name: queue_counts_live
SELECT queue, 'available' AS status, count(*) AS n FROM jobkeeper_jobs WHERE status = 'available'
GROUP BY queue
UNION ALL
SELECT queue, status, count(*) AS n FROM jobkeeper_jobs
WHERE status IN ('scheduled', 'retryable') GROUP BY queue, status
UNION ALL
SELECT queue, status, count(*) AS n FROM jobkeeper_jobs
WHERE status IN ('claimed', 'running') GROUP BY queue, status

-- name: queue_counts_finished
-- See the PostgreSQL twin: at most :cap rows, newest first down the finished index.
SELECT queue, status, count(*) AS n
FROM (SELECT queue, status FROM jobkeeper_jobs
      WHERE status IN ('completed', 'cancelled')
      ORDER BY finished_at DESC
      LIMIT :cap)
GROUP BY queue, status

-- name: queue_counts_finished_since
SELECT queue, status, count(*) AS n
FROM (SELECT queue, status FROM jobkeeper_jobs
      WHERE status IN ('completed', 'cancelled') AND finished_at > :since
      ORDER BY finished_at DESC
      LIMIT :cap)
GROUP BY queue, status

-- name: queue_counts_finished_upto
-- See the PostgreSQL twin. Here 1.3-2 s per 2 million finished rows: the GROUP BY
-- sorts every row (no index orders them by queue; one would cost every ack).
SELECT queue, status, count(*) AS n FROM jobkeeper_jobs
WHERE status IN ('completed', 'cancelled') AND finished_at <= :upto
GROUP BY queue, status

-- name: queue_counts_dead
SELECT queue, count(*) AS n
FROM (SELECT queue FROM jobkeeper_dead_letters LIMIT :cap)
GROUP BY queue

-- name: queue_counts_dead_all
SELECT queue, count(*) AS n FROM jobkeeper_dead_letters GROUP BY queue

-- name: queue_counts_of_queue
-- See the PostgreSQL twin: :queue's live rows only (its available ones down
-- the claim index), and the capped samples of every queue's finished rows
-- and dead letters with their size (sampled).
SELECT 'available' AS status, count(*) AS n, NULL AS sampled
FROM jobkeeper_jobs WHERE status = 'available' AND queue = :queue
UNION ALL
SELECT status, count(*), NULL FROM jobkeeper_jobs
WHERE status IN ('scheduled', 'retryable') AND queue = :queue GROUP BY status
UNION ALL
SELECT status, count(*), NULL FROM jobkeeper_jobs
WHERE status IN ('claimed', 'running') AND queue = :queue GROUP BY status
UNION ALL
SELECT status, coalesce(sum(queue = :queue), 0), count(*)
FROM (SELECT queue, status FROM jobkeeper_jobs
      WHERE status IN ('completed', 'cancelled')
      ORDER BY finished_at DESC
      LIMIT :cap)
GROUP BY status
UNION ALL
SELECT 'dead', coalesce(sum(queue = :queue), 0), count(*)
FROM (SELECT queue FROM jobkeeper_dead_letters LIMIT :cap)

-- name: database_health_write_probe
-- doctor: a write, in a BEGIN IMMEDIATE transaction the caller rolls back:
-- a file the process cannot write (read-only, chattr +i) refuses it.
CREATE TABLE main.jobkeeper_write_probe AS SELECT 'x' AS filler

-- name: database_health_journal_mode
PRAGMA journal_mode

-- name: database_health_busy_timeout
PRAGMA busy_timeout

-- name: database_health_claim_plan
-- doctor: the claim's read must walk jobkeeper_jobs_claim_idx.
EXPLAIN QUERY PLAN
SELECT id
FROM jobkeeper_jobs
WHERE status = 'available' AND queue = :queue
ORDER BY priority, scheduled_at, id
LIMIT 10

-- name: periodic_upsert
-- A worker's start (one row per statement, all in one BEGIN IMMEDIATE):
-- the code's definition replaces the stored one. An unchanged schedule keeps
-- its tick record and seen_at; a new or changed one starts from now. In
-- DO UPDATE, p.* is the old row whatever the order of the SET items.
INSERT INTO jobkeeper_periodic AS p
    (name, schedule, timezone, task, queue, priority, max_attempts, args, catch_up,
     since_at, seen_at, created_at, updated_at)
VALUES (:name, :schedule, :timezone, :task, :queue, :priority, :max_attempts, :args, :catch_up,
        {now}, {now}, {now}, {now})
ON CONFLICT (name) DO UPDATE
SET since_at = CASE WHEN p.schedule = excluded.schedule AND p.timezone = excluded.timezone
                    THEN p.since_at ELSE {now} END,
    seen_at = CASE WHEN p.schedule = excluded.schedule AND p.timezone = excluded.timezone
                   THEN p.seen_at ELSE {now} END,
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
    updated_at = {now}

-- name: periodic_enqueue_tick
-- The tick record half of one tick; the job's insert (periodic_enqueue_tick_insert)
-- follows in the same BEGIN IMMEDIATE transaction, and only when this
-- returned the row: the write lock makes a twin wait, then find nothing.
UPDATE jobkeeper_periodic
SET last_tick_at = :tick, next_tick_at = :next_tick
WHERE name = :name AND schedule = :schedule AND timezone = :timezone
  AND since_at < :tick
  AND (last_tick_at IS NULL OR last_tick_at < :tick)
RETURNING task, queue, args, priority, max_attempts

-- name: periodic_enqueue_tick_insert
INSERT INTO jobkeeper_jobs
    (queue, task, args, status, priority, max_attempts, scheduled_at, created_at,
     serial_unkeyed)
VALUES (:queue, :task, :args,
        CASE WHEN :tick > {now} THEN 'scheduled' ELSE 'available' END,
        :priority, :max_attempts, :tick, {now}, {serial_unkeyed})
RETURNING id

-- name: periodic_skip
-- Missed ticks too old for catch_up: not owed any more (since_at only moves forward).
UPDATE jobkeeper_periodic
SET since_at = :through, next_tick_at = :next_tick
WHERE name = :name AND schedule = :schedule AND timezone = :timezone
  AND since_at < :through
  AND (last_tick_at IS NULL OR last_tick_at < :through)
RETURNING name

-- name: periodic_touch
-- Each pass, per row: a worker registering this very definition is alive.
UPDATE jobkeeper_periodic
SET seen_at = max(seen_at, {now}), next_tick_at = :next_tick
WHERE name = :name AND schedule = :schedule AND timezone = :timezone
RETURNING name

-- name: periodic_list
SELECT name, schedule, timezone, task, queue, priority, max_attempts, args, catch_up,
       since_at, last_tick_at, next_tick_at, seen_at,
       seen_at < {now} - :stale_after AS stale
FROM jobkeeper_periodic
ORDER BY name

-- name: periodic_prune
DELETE FROM jobkeeper_periodic
WHERE seen_at < {now} - :stale_after
RETURNING name


-- Flow control: per-queue settings (jobkeeper_queues), backpressure, serial
-- keys. Everything below runs inside the claim's or the insert's BEGIN
-- IMMEDIATE, so the counts cannot change between the check and the write.

-- name: job_claim_settings
SELECT name, paused, concurrency, rate_limit, rate_period, max_pending, serial
FROM jobkeeper_queues
WHERE name = :name

-- name: queue_settings_list
SELECT name, paused, concurrency, rate_limit, rate_period, max_pending, serial
FROM jobkeeper_queues
WHERE :names IS NULL OR name IN (SELECT value FROM json_each(:names))
ORDER BY name

-- name: queue_configure
-- Only the settings given change (each comes with a "set_" flag).
INSERT INTO jobkeeper_queues AS q
    (name, paused, concurrency, rate_limit, rate_period, max_pending, updated_at)
VALUES (:name, coalesce(:paused, 0), :concurrency, :rate_limit, :rate_period, :max_pending,
        {now})
ON CONFLICT (name) DO UPDATE
SET paused = CASE WHEN :set_paused THEN excluded.paused ELSE q.paused END,
    concurrency = CASE WHEN :set_concurrency THEN excluded.concurrency ELSE q.concurrency END,
    rate_limit = CASE WHEN :set_rate THEN excluded.rate_limit ELSE q.rate_limit END,
    rate_period = CASE WHEN :set_rate THEN excluded.rate_period ELSE q.rate_period END,
    max_pending = CASE WHEN :set_max_pending THEN excluded.max_pending ELSE q.max_pending END,
    updated_at = {now}
RETURNING name, paused, concurrency, rate_limit, rate_period, max_pending, serial

-- name: queue_configure_delete_if_empty
-- A row with nothing set goes (the queue claims on the fast path again).
DELETE FROM jobkeeper_queues
WHERE name = :name AND NOT paused AND NOT serial AND concurrency IS NULL
  AND rate_limit IS NULL AND max_pending IS NULL

-- name: queue_configure_starts_forget
-- The claim times of a queue without a rate limit are of no use.
DELETE FROM jobkeeper_queue_starts
WHERE queue = :name
  AND NOT EXISTS (SELECT 1 FROM jobkeeper_queues WHERE name = :name AND rate_limit IS NOT NULL)

-- name: job_insert_many_mark_serial
-- Marks the queue serial; when it was not, job_insert_many_flag_unkeyed
-- follows (the caller reads changes()).
INSERT INTO jobkeeper_queues (name, serial) VALUES (:name, 1)
ON CONFLICT (name) DO UPDATE SET serial = 1 WHERE NOT serial

-- name: job_insert_many_flag_unkeyed
-- A queue marked serial now flags its unfinished unkeyed jobs, those of this
-- insert too (see 0017_serial_unkeyed_index.sql): it reads the queue's jobs
-- once, in the life of the queue.
UPDATE jobkeeper_jobs SET serial_unkeyed = 1
WHERE queue = :name AND serial_key IS NULL AND serial_unkeyed IS NULL
  AND status IN ('scheduled', 'available', 'claimed', 'running', 'retryable')

-- name: job_insert_many_pending_limits
SELECT name, max_pending FROM jobkeeper_queues
WHERE name IN (SELECT value FROM json_each(:queues)) AND max_pending IS NOT NULL

-- name: job_insert_many_count_pending
-- Pending: scheduled, available, claimed or retryable, counted status by
-- status within the partial indexes that hold only such rows (claim, due,
-- held): one condition naming all four matches no index, and its plan
-- scanned the whole table, finished rows too. SQLite uses a partial index
-- only when the query repeats the index's own WHERE term (it does not see
-- that status = 'claimed' implies the held index's IN list), hence both.
SELECT queue, sum(n) AS n FROM (
    SELECT queue, count(*) AS n FROM jobkeeper_jobs
    WHERE status = 'available' AND queue IN (SELECT value FROM json_each(:queues))
    GROUP BY queue
    UNION ALL
    SELECT queue, count(*) FROM jobkeeper_jobs
    WHERE status IN ('scheduled', 'retryable')
      AND queue IN (SELECT value FROM json_each(:queues))
    GROUP BY queue
    UNION ALL
    SELECT queue, count(*) FROM jobkeeper_jobs
    WHERE status IN ('claimed', 'running') AND status = 'claimed'
      AND queue IN (SELECT value FROM json_each(:queues))
    GROUP BY queue
)
GROUP BY queue

-- name: job_claim_held
-- Held rows count until a rescue frees them: a crash leaks no capacity.
SELECT count(*) FROM jobkeeper_jobs
WHERE queue = :queue AND status IN ('claimed', 'running')

-- name: job_claim_starts_prune
DELETE FROM jobkeeper_queue_starts WHERE queue = :queue AND started_at <= {now} - :period

-- name: job_claim_starts_count
SELECT coalesce(sum(jobs), 0) FROM jobkeeper_queue_starts WHERE queue = :queue

-- name: job_claim_starts_record
INSERT INTO jobkeeper_queue_starts (queue, started_at, jobs) VALUES (:queue, {now}, :jobs)

-- name: job_claim_serial_head_end
-- The last of the queue's first :budget jobs, in claim order, leaving out
-- the jobs of the keys in :held (a JSON array; none: the queue is shorter):
-- where job_claim_serial_head stops looking.
SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
WHERE job.status = 'available' AND job.queue = :queue
  AND (job.serial_key IS NULL OR job.serial_key NOT IN (SELECT value FROM json_each(:held)))
ORDER BY job.priority, job.scheduled_at, job.id
LIMIT 1 OFFSET :budget - 1

-- name: job_claim_serial_head_held
-- Keys of the queue's first :budget keyed jobs (in claim order, those of
-- :held left out) that are held in any queue, at most :room: the deep held
-- keys a head walk that found too little was full of.
SELECT keyed.key FROM (
    SELECT DISTINCT head.serial_key AS key FROM (
        SELECT job.serial_key FROM jobkeeper_jobs AS job
        WHERE job.status = 'available' AND job.queue = :queue
          AND job.serial_key IS NOT NULL
          AND job.serial_key NOT IN (SELECT value FROM json_each(:held))
        ORDER BY job.priority, job.scheduled_at, job.id
        LIMIT :budget) AS head) AS keyed
WHERE EXISTS (
    SELECT 1 FROM jobkeeper_jobs AS holder
    WHERE holder.serial_key = keyed.key AND holder.status IN ('claimed', 'running'))
LIMIT :room

-- name: job_claim_serial_head
-- As job_claim_pick, but a keyed job is taken only while it is its key's
-- first due job in the queue (priority, scheduled_at, id) and no job of the
-- key is held (in any queue), up to (:priority, :scheduled_at, :id), the
-- jobs of the keys in :held (a JSON array) left out unprobed. At most
-- one job per key per claim follows: a second job of a key has the first
-- before it. Each walk stops as soon as :limit are found (the usual case
-- with many shallow keys, or few keyed jobs among unkeyed ones). The bound is
-- three ranges, not one row value: the index range of a row value ended on
-- (priority, scheduled_at) only, and a bulk enqueue's jobs share both.
SELECT picked.id FROM (
    SELECT * FROM (
        SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
        WHERE job.status = 'available' AND job.queue = :queue
          AND job.priority < :priority
          AND {serial_takeable}
        ORDER BY job.priority, job.scheduled_at, job.id
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
        WHERE job.status = 'available' AND job.queue = :queue
          AND job.priority = :priority AND job.scheduled_at < :scheduled_at
          AND {serial_takeable}
        ORDER BY job.priority, job.scheduled_at, job.id
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
        WHERE job.status = 'available' AND job.queue = :queue
          AND job.priority = :priority AND job.scheduled_at = :scheduled_at
          AND job.id <= :id
          AND {serial_takeable}
        ORDER BY job.priority, job.scheduled_at, job.id
        LIMIT :limit)
) AS picked
ORDER BY picked.priority, picked.scheduled_at, picked.id
LIMIT :limit

-- name: job_claim_serial_keys
-- The queue's keys with an available job, in key order, at most :budget: a
-- loose index scan of jobkeeper_jobs_serial_queue_idx (the queue, then a key
-- range), one probe for the next key after the last.
WITH RECURSIVE serial_keys(key) AS (
    SELECT (
        SELECT lowest.serial_key FROM jobkeeper_jobs AS lowest
        WHERE lowest.status = 'available' AND lowest.queue = :queue
          AND lowest.serial_key IS NOT NULL
        ORDER BY lowest.serial_key
        LIMIT 1)
    UNION ALL
    SELECT (
        SELECT next.serial_key FROM jobkeeper_jobs AS next
        WHERE next.status = 'available' AND next.queue = :queue
          AND next.serial_key IS NOT NULL AND next.serial_key > serial_keys.key
        ORDER BY next.serial_key
        LIMIT 1)
    FROM serial_keys
    WHERE serial_keys.key IS NOT NULL
)
SELECT key FROM serial_keys WHERE key IS NOT NULL LIMIT :budget

-- name: job_claim_serial_firsts
-- Of the keys :keys (a JSON array), each one's first available job in the
-- queue where nobody holds the key (one probe per key, however deep), in
-- claim order, at most :limit.
SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
WHERE job.id IN (
    SELECT (
        SELECT first.id FROM jobkeeper_jobs AS first
        WHERE first.serial_key = listed.value AND first.serial_key IS NOT NULL
          AND first.queue = :queue AND first.status = 'available'
        ORDER BY first.priority, first.scheduled_at, first.id
        LIMIT 1)
    FROM json_each(:keys) AS listed
    WHERE NOT EXISTS (
        SELECT 1 FROM jobkeeper_jobs AS holder
        WHERE holder.serial_key = listed.value
          AND holder.status IN ('claimed', 'running')))
ORDER BY job.priority, job.scheduled_at, job.id
LIMIT :limit

-- name: job_claim_serial_unkeyed
-- The queue's first unkeyed available jobs up to (priority, scheduled_at,
-- id) = (:priority, :scheduled_at, :id), at most :limit: past the keyed jobs
-- a full claim takes, none is needed, and the walk stops there instead of
-- stepping over every keyed job to the queue's end. Three ranges, as in
-- job_claim_serial_head. Flagged jobs only (jobkeeper_jobs_serial_unkeyed_idx):
-- the claim index with "serial_key IS NULL" read past every keyed job ahead
-- of them, the whole queue when the claim was short. An unkeyed job left
-- unflagged is taken when a head walk reaches it.
SELECT picked.id, picked.priority, picked.scheduled_at FROM (
    SELECT * FROM (
        SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
        WHERE job.status = 'available' AND job.queue = :queue
          AND job.priority < :priority
          AND job.serial_unkeyed = 1
        ORDER BY job.priority, job.scheduled_at, job.id
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
        WHERE job.status = 'available' AND job.queue = :queue
          AND job.priority = :priority AND job.scheduled_at < :scheduled_at
          AND job.serial_unkeyed = 1
        ORDER BY job.priority, job.scheduled_at, job.id
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT job.id, job.priority, job.scheduled_at FROM jobkeeper_jobs AS job
        WHERE job.status = 'available' AND job.queue = :queue
          AND job.priority = :priority AND job.scheduled_at = :scheduled_at
          AND job.id <= :id
          AND job.serial_unkeyed = 1
        ORDER BY job.priority, job.scheduled_at, job.id
        LIMIT :limit)
) AS picked
ORDER BY picked.priority, picked.scheduled_at, picked.id
LIMIT :limit

-- name: periodic_enqueue_tick_queue
SELECT queue FROM jobkeeper_periodic WHERE name = :name

-- name: completion_watch_pending
-- Which of the waited-for jobs are still pending (not finished, dead or gone):
-- the watch reads it only after a commit (a new data_version).
SELECT id FROM jobkeeper_jobs
WHERE id IN (SELECT value FROM json_each(:ids)) AND status NOT IN ('completed', 'cancelled')

-- name: listen_data_version
-- Changes whenever another connection commits to the file: the listener's
-- cue to wake the worker (a read of a counter in the WAL's shared memory).
PRAGMA data_version

-- name: installation_get
-- The database's random installation value (migration 0008), read once per
-- worker: it prefixes every idempotency key handed to a task.
SELECT id FROM jobkeeper_installation LIMIT 1

-- name: job_complete_in
-- complete_in(): on the caller's connection, in the caller's transaction,
-- fenced on the whole claim (see the PostgreSQL twin). The caller's
-- transaction holds SQLite's write lock from its first write to its commit.
UPDATE jobkeeper_jobs
SET status = 'completed', finished_at = {now}, worker_id = NULL, result = :result,
    run_alone = 0
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status IN ('claimed', 'running')

-- name: job_complete_in_delete
DELETE FROM jobkeeper_jobs
WHERE id = :id AND worker_id = :worker_id AND attempt = :attempt AND fence = :fence
  AND status IN ('claimed', 'running')

-- name: job_completed_in
-- Whether a refused outcome was refused because complete_in had committed:
-- completed at that claim's fence, or, with retention = 0, gone.
SELECT :id AS id
WHERE NOT EXISTS (SELECT 1 FROM jobkeeper_jobs WHERE id = :id) AND :delete
   OR EXISTS (SELECT 1 FROM jobkeeper_jobs
              WHERE id = :id AND status = 'completed' AND fence = :fence)
