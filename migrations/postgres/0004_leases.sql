-- Several replicas (DESIGN §2), the PostgreSQL twin of migrations/sqlite/0003_leases.sql:
-- blob state in the checkpoint, upload leases on the database clock, shared secrets.
-- Release requests travel by NOTIFY on the channel `ferry_release` (no table).
ALTER TABLE uploads ADD COLUMN blob_state BYTEA NOT NULL DEFAULT ''::bytea;
ALTER TABLE uploads ADD COLUMN lease_owner TEXT;
ALTER TABLE uploads ADD COLUMN lease_expires_ms BIGINT;
-- TRUE when the current lease was taken from a holder that never released it (the taker repairs).
ALTER TABLE uploads ADD COLUMN lease_taken_over BOOLEAN NOT NULL DEFAULT FALSE;

-- Secrets every replica shares (the URL-signing key): created once, never replaced.
CREATE TABLE shared_secrets (
    name  TEXT PRIMARY KEY NOT NULL,
    value BYTEA NOT NULL
);
