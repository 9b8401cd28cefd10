-- Issue 48 kind 3: an upload's row goes first, then its bytes. Deleting a row (termination, a
-- refused creation withdrawn, a final whose checksum failed, a tombstone forgotten…) queues its
-- id here in the same transaction; the bytes are removed after it (fs: unlink, then the
-- directory's fsync) and only then is the id forgotten. A crash in between leaves the id here,
-- and the next start (or the sweeper) removes what is left: never a finished upload without
-- bytes, never bytes no row or removal names. `ferry check` counts a blob named here as being
-- removed, not as an orphan.
CREATE TABLE blob_removals (
    id TEXT PRIMARY KEY NOT NULL,
    at_ms INTEGER NOT NULL
);

CREATE TRIGGER blob_removals_queue AFTER DELETE ON uploads
BEGIN
    INSERT OR REPLACE INTO blob_removals (id, at_ms)
    VALUES (OLD.id, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER));
END;
