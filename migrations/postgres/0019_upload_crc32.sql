-- Issue 51: the CRC-32 (ISO 3309, as zip uses it) of a finished upload's bytes, computed the
-- first time a zip of several files needs it (while streaming the member, or by reading it) and
-- kept, so a resumed or ranged zip download never reads a member again to write its central
-- directory. A finished upload's bytes never change, so neither does the value. The row goes
-- with its upload.
CREATE TABLE IF NOT EXISTS upload_crc32 (
    id TEXT PRIMARY KEY NOT NULL REFERENCES uploads (id) ON DELETE CASCADE,
    crc32 BIGINT NOT NULL
);
