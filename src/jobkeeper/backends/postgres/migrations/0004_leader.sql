-- One lease row per fleet-wide role ('maintenance'): the worker holding an
-- unexpired lease is the leader and runs the services that must run once per
-- fleet (the pruner). Leadership decides who works, never what is written:
-- every write those services make stays correct with two leaders.
CREATE TABLE jobkeeper_leader (
    name       text        PRIMARY KEY,
    worker_id  text        NOT NULL,
    elected_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
