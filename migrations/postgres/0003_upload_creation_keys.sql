-- Idempotent creation (issue 9, item 5), the PostgreSQL twin of
-- migrations/sqlite/0003_upload_creation_keys.sql: the key an upload was created under, per
-- principal, and a fingerprint of the creation request it was made for. A live (not
-- tombstoned) upload holds its key; deleting the row or marking it expired frees the key.
ALTER TABLE uploads ADD COLUMN creation_key TEXT;
ALTER TABLE uploads ADD COLUMN creation_fingerprint TEXT;
CREATE UNIQUE INDEX uploads_creation_key ON uploads (principal, creation_key) WHERE creation_key IS NOT NULL AND NOT expired;
