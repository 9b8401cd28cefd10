-- Issue 48 kind 3; the PostgreSQL twin of migrations/sqlite/0018 (see there): deleting an
-- upload's row queues its bytes for removal in the same transaction.
CREATE TABLE IF NOT EXISTS blob_removals (
    id TEXT PRIMARY KEY NOT NULL,
    at_ms BIGINT NOT NULL
);

CREATE OR REPLACE FUNCTION ferry_queue_blob_removal() RETURNS TRIGGER
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO blob_removals (id, at_ms)
    VALUES (OLD.id, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT)
    ON CONFLICT (id) DO UPDATE SET at_ms = EXCLUDED.at_ms;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS blob_removals_queue ON uploads;
CREATE TRIGGER blob_removals_queue AFTER DELETE ON uploads
    FOR EACH ROW EXECUTE FUNCTION ferry_queue_blob_removal();
