-- Periodic jobs: one row per periodic name, written by every worker whose
-- app registers it. The row is the tick record: a tick is enqueued by one
-- statement that advances last_tick_at and inserts the job together, so a
-- crash can lose neither half (procrastinate#1495) and pruning jobs cannot
-- make a tick fire again (good_job#731: the record is here, not in the jobs).
CREATE TABLE jobkeeper_periodic (
    name         text        PRIMARY KEY,
    -- str(Schedule) and its time zone: every write of a tick matches on
    -- both, so a worker still running a replaced definition fires nothing.
    schedule     text        NOT NULL,
    timezone     text        NOT NULL,
    -- The job template, as the code that last registered the name says.
    task         text        NOT NULL,
    queue        text        NOT NULL,
    priority     integer     NOT NULL,
    max_attempts integer     NOT NULL CHECK (max_attempts > 0),
    args         json        NOT NULL,
    catch_up     double precision NOT NULL CHECK (catch_up >= 0),
    -- Ticks at or before since_at are not owed (first sight, replacement,
    -- or skipped as missed); last_tick_at is the last tick enqueued.
    since_at     timestamptz NOT NULL DEFAULT now(),
    last_tick_at timestamptz,
    next_tick_at timestamptz,
    -- The last pass of a worker registering this definition: ticks due
    -- before it (plus a pass or two) came due while a worker was alive.
    seen_at      timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
