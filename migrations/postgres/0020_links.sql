-- Issue 51; the PostgreSQL twin of migrations/sqlite/0019 (see there): links as catalog
-- records, and their files in order.
CREATE TABLE IF NOT EXISTS links (
    id TEXT PRIMARY KEY NOT NULL,
    principal TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('share', 'request')),
    message TEXT NOT NULL DEFAULT '',
    passphrase_hash TEXT,
    max_downloads BIGINT,
    downloads BIGINT NOT NULL DEFAULT 0,
    max_files BIGINT NOT NULL,
    files_added BIGINT NOT NULL DEFAULT 0,
    expires_at_ms BIGINT NOT NULL,
    revoked_at_ms BIGINT,
    created_at_ms BIGINT NOT NULL
);

CREATE INDEX IF NOT EXISTS links_by_principal ON links (principal, created_at_ms);

CREATE TABLE IF NOT EXISTS link_files (
    link_id TEXT NOT NULL REFERENCES links (id) ON DELETE CASCADE,
    position BIGINT NOT NULL,
    file_id TEXT NOT NULL,
    PRIMARY KEY (link_id, position)
);

CREATE INDEX IF NOT EXISTS link_files_by_file ON link_files (file_id);
