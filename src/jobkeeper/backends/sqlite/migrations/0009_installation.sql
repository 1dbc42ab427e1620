-- One random value per database, drawn once at migration: it makes
-- idempotency keys (current_job().idempotency_key) distinct across
-- databases, whose job ids start at 1 alike.
CREATE TABLE jobkeeper_installation (
    id         TEXT PRIMARY KEY,
    created_at REAL NOT NULL
);
INSERT INTO jobkeeper_installation (id, created_at)
VALUES (lower(hex(randomblob(16))), (julianday('now') - 2440587.5) * 86400.0);
