-- One random value per database (and schema), drawn once at migration: it
-- makes idempotency keys (current_job().idempotency_key) distinct across
-- databases, whose job ids start at 1 alike. gen_random_uuid() is core
-- since PostgreSQL 13.
CREATE TABLE jobkeeper_installation (
    id         text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO jobkeeper_installation (id) VALUES (replace(gen_random_uuid()::text, '-', ''));
