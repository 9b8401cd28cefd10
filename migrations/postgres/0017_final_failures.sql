-- A final upload of a concatenation (TUS 1.0 §Concatenation) whose build failed for good (the
-- concatenation is larger than the maximum upload size, or than its principal's bytes quota):
-- the final is tombstoned (its parts are free again) and this row says why, so HEAD, GET and
-- the files API answer that instead of "not built yet". The row goes with its upload.
CREATE TABLE IF NOT EXISTS final_failures (
    id TEXT PRIMARY KEY NOT NULL REFERENCES uploads (id) ON DELETE CASCADE,
    code TEXT NOT NULL,
    detail TEXT NOT NULL,
    failed_at_ms BIGINT NOT NULL
);
