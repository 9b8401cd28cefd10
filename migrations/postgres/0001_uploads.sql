-- Uploads (DESIGN §2), the PostgreSQL twin of migrations/sqlite/0001_uploads.sql.
-- Offsets and lengths are bytes; times are Unix ms.

-- The database's clock in Unix ms: every lease, expiry and sweep compares against this one
-- clock, never against a replica's own.
CREATE FUNCTION ferry_now_ms() RETURNS BIGINT
    LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT $$;

CREATE TABLE uploads (
    id              TEXT PRIMARY KEY NOT NULL,
    principal       TEXT NOT NULL,
    length          BIGINT,
    "offset"        BIGINT NOT NULL,
    metadata        TEXT NOT NULL,
    hash_state      BYTEA NOT NULL,
    sha256          BYTEA,
    expected_sha256 BYTEA,
    concat_kind     TEXT NOT NULL CHECK (concat_kind IN ('none', 'partial', 'final')),
    concat_parts    TEXT,
    concat_header   TEXT,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    expires_at_ms   BIGINT,
    finished_at_ms  BIGINT,
    expired         BOOLEAN NOT NULL DEFAULT FALSE,
    fence           BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX uploads_expiry ON uploads (expires_at_ms) WHERE finished_at_ms IS NULL AND NOT expired;
CREATE INDEX uploads_principal ON uploads (principal, created_at_ms);
