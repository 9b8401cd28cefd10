-- Issue 51: the CRC-32 (ISO 3309, as zip uses it) of a finished upload's bytes, computed the
-- first time a zip of several files needs it (while streaming the member, or by reading it) and
-- kept, so a resumed or ranged zip download never reads a member again to write its central
-- directory. A finished upload's bytes never change, so neither does the value. The row goes
-- with its upload.
CREATE TABLE upload_crc32 (
    id TEXT PRIMARY KEY NOT NULL,
    crc32 INTEGER NOT NULL
);

CREATE TRIGGER upload_crc32_gone AFTER DELETE ON uploads
BEGIN
    DELETE FROM upload_crc32 WHERE id = OLD.id;
END;
