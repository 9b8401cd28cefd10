-- Uploads (DESIGN §2). Offsets and lengths are bytes; times are Unix ms.
CREATE TABLE uploads (
    id              TEXT PRIMARY KEY NOT NULL,
    principal       TEXT NOT NULL,
    length          INTEGER,
    "offset"        INTEGER NOT NULL,
    metadata        TEXT NOT NULL,
    hash_state      BLOB NOT NULL,
    sha256          BLOB,
    expected_sha256 BLOB,
    concat_kind     TEXT NOT NULL CHECK (concat_kind IN ('none', 'partial', 'final')),
    concat_parts    TEXT,
    concat_header   TEXT,
    created_at_ms   INTEGER NOT NULL,
    updated_at_ms   INTEGER NOT NULL,
    expires_at_ms   INTEGER,
    finished_at_ms  INTEGER,
    expired         INTEGER NOT NULL DEFAULT 0,
    fence           INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX uploads_expiry ON uploads (expires_at_ms) WHERE finished_at_ms IS NULL AND expired = 0;
CREATE INDEX uploads_principal ON uploads (principal, created_at_ms);
