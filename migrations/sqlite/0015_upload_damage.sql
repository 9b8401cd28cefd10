-- Issue 26 item 4: `ferry check --repair-catalog` marks a finished upload whose stored bytes no
-- longer match its sha256 (or are missing) as damaged, so downloads answer `500 damaged`
-- instead of serving wrong bytes. The bytes themselves are never touched. A later check that
-- finds the bytes whole again (restored from a backup) clears the mark. The row goes with its
-- upload.
CREATE TABLE upload_damage (
    id TEXT PRIMARY KEY NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    found_at_ms INTEGER NOT NULL
);

CREATE TRIGGER upload_damage_gone AFTER DELETE ON uploads
BEGIN
    DELETE FROM upload_damage WHERE id = OLD.id;
END;
