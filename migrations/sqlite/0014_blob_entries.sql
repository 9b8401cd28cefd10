-- The part list out of the hot row (issue 22, fault 8): a framed blob state's entries (S3: one
-- per uploaded part) live here, in order; `uploads.blob_state` keeps only the head, which every
-- HEAD, GET and list reads. A checkpoint appends the entries it added.
CREATE TABLE upload_blob_entries (
    upload_id TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    entry     BLOB NOT NULL,
    PRIMARY KEY (upload_id, seq)
) WITHOUT ROWID;

-- Whatever removes an upload's row removes its entries (SQLite enforces no foreign key here).
CREATE TRIGGER upload_blob_entries_follow_uploads AFTER DELETE ON uploads
BEGIN
    DELETE FROM upload_blob_entries WHERE upload_id = OLD.id;
END;

-- How many times the upload's lease was taken from a holder that never let go (issue 22,
-- fault 5): writers of different counts may overlap in time, and S3 gives them different
-- part numbers by its parity.
ALTER TABLE uploads ADD COLUMN lease_takeovers INTEGER NOT NULL DEFAULT 0;
