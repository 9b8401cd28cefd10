-- Issue 26 item 4: `ferry check --repair-catalog` marks a finished upload whose stored bytes no
-- longer match its sha256 (or are missing) as damaged, so downloads answer `500 damaged`
-- instead of serving wrong bytes. The bytes themselves are never touched. A later check that
-- finds the bytes whole again (restored from a backup) clears the mark. The row goes with its
-- upload.
CREATE TABLE IF NOT EXISTS upload_damage (
    id TEXT PRIMARY KEY NOT NULL REFERENCES uploads (id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    found_at_ms BIGINT NOT NULL
);
