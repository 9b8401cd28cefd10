-- Issue 51: links a person opens (`/l/{id}`) that are catalog records, not only signatures: a
-- share of several files or a request for several files, with a message, an optional
-- passphrase (an argon2 PHC string, never returned), an optional download limit counted in one
-- compare-and-set UPDATE, an expiry and a revocation. `link_files` holds the link's files in
-- order: a share's at creation, a request's as each is created through the link (a slot is
-- taken in `files_added` first, so a request never holds more than `max_files`).
CREATE TABLE links (
    id TEXT PRIMARY KEY NOT NULL,
    principal TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('share', 'request')),
    message TEXT NOT NULL DEFAULT '',
    passphrase_hash TEXT,
    max_downloads INTEGER,
    downloads INTEGER NOT NULL DEFAULT 0,
    max_files INTEGER NOT NULL,
    files_added INTEGER NOT NULL DEFAULT 0,
    expires_at_ms INTEGER NOT NULL,
    revoked_at_ms INTEGER,
    created_at_ms INTEGER NOT NULL
);

CREATE INDEX links_by_principal ON links (principal, created_at_ms);

CREATE TABLE link_files (
    link_id TEXT NOT NULL REFERENCES links (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    file_id TEXT NOT NULL,
    PRIMARY KEY (link_id, position)
);

CREATE INDEX link_files_by_file ON link_files (file_id);
