-- The PostgreSQL twin of migrations/sqlite/0014_blob_entries.sql: a framed blob state's
-- entries (S3: one per uploaded part) beside the upload's row, which keeps only the head.
CREATE TABLE upload_blob_entries (
    upload_id TEXT NOT NULL REFERENCES uploads (id) ON DELETE CASCADE,
    seq       INTEGER NOT NULL,
    entry     BYTEA NOT NULL,
    PRIMARY KEY (upload_id, seq)
);

-- How many times the upload's lease was taken from a holder that never let go: writers of
-- different counts may overlap in time, and S3 gives them different part numbers by its parity.
ALTER TABLE uploads ADD COLUMN lease_takeovers BIGINT NOT NULL DEFAULT 0;
