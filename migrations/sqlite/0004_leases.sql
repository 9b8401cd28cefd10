-- Several replicas (DESIGN §2): blob state in the checkpoint, upload leases on the database
-- clock, release requests between processes, shared secrets.
ALTER TABLE uploads ADD COLUMN blob_state BLOB NOT NULL DEFAULT x'';
ALTER TABLE uploads ADD COLUMN lease_owner TEXT;
ALTER TABLE uploads ADD COLUMN lease_expires_ms INTEGER;
-- 1 when the current lease was taken from a holder that never released it (the taker repairs).
ALTER TABLE uploads ADD COLUMN lease_taken_over INTEGER NOT NULL DEFAULT 0;

-- Release-on-request across processes (PostgreSQL uses NOTIFY instead); rows are pruned after a minute.
CREATE TABLE lease_requests (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    upload_id  TEXT NOT NULL,
    from_owner TEXT NOT NULL,
    at_ms      INTEGER NOT NULL
);

-- Secrets every replica shares (the URL-signing key): created once, never replaced.
CREATE TABLE shared_secrets (
    name  TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL
);
