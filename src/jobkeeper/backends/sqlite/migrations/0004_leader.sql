-- One lease row per fleet-wide role ('maintenance'): the worker holding an
-- unexpired lease is the leader and runs the services that must run once per
-- fleet (the pruner). Leadership decides who works, never what is written.
CREATE TABLE jobkeeper_leader (
    name       TEXT PRIMARY KEY,
    worker_id  TEXT NOT NULL,
    elected_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
