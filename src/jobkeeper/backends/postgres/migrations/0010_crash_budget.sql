-- Version 10: the crash budget (poison jobs).
-- run_alone: the job's last running attempt was rescued from a silent
-- holder, so its next attempt must run alone on its worker (nothing beside
-- it), where a crash can be pinned on it. Set by the rescuer; cleared by the
-- first outcome a worker writes for it (it ran without crashing its worker);
-- kept across hand-backs and free returns (it has not had its lone run yet).
-- alone_fence: the fence of the claim a worker started alone (its urgent
-- start mark, job_start_alone): a rescue of the job while running under
-- that same fence is a pinned crash.
-- crashes: pinned crashes so far; the rescuer sends the job to the dead
-- letters once they reach max_crashes.
-- A worker from before this version never reads these columns: it claims a
-- run_alone job like any other and runs it beside others, and, never
-- writing alone_fence, is never taken to have run it alone: a crash during
-- it costs the attempt, as before, and is not counted in crashes.
ALTER TABLE jobkeeper_jobs ADD COLUMN run_alone boolean NOT NULL DEFAULT false;
ALTER TABLE jobkeeper_jobs ADD COLUMN alone_fence bigint;
ALTER TABLE jobkeeper_jobs ADD COLUMN crashes integer NOT NULL DEFAULT 0
    CONSTRAINT jobkeeper_jobs_crashes_valid CHECK (crashes >= 0);
-- Kept with the dead letter (its reason names it too); a requeue starts afresh.
-- An older worker's dead-letter move leaves it 0.
ALTER TABLE jobkeeper_dead_letters ADD COLUMN crashes integer NOT NULL DEFAULT 0;
