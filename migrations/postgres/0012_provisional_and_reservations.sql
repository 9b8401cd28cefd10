-- Issue 23 items 4 and 7; the PostgreSQL twin of migrations/sqlite/0012 (see there).
-- The trigger stays a constraint trigger deferred to commit, as 0011 made it.
ALTER TABLE uploads ADD COLUMN announced BOOLEAN NOT NULL DEFAULT TRUE;
ALTER TABLE uploads ADD COLUMN reserved_to BIGINT;
ALTER TABLE uploads ADD COLUMN reservation TEXT;

CREATE OR REPLACE FUNCTION ferry_upload_events() RETURNS TRIGGER
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.announced THEN
            PERFORM ferry_emit_event('upload.created', NEW.principal, NEW.id,
                json_build_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset", 'metadata', NEW.metadata,
                                  'concat', NEW.concat_kind, 'expires_at_ms', NEW.expires_at_ms));
        END IF;
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        -- Deleting a tombstone (already announced as expired) is housekeeping, not a change;
        -- deleting a row never announced (a refused creation) is no change either.
        IF NOT OLD.expired AND OLD.announced THEN
            PERFORM ferry_emit_event('upload.terminated', OLD.principal, OLD.id,
                json_build_object('upload', OLD.id, 'length', OLD.length, 'offset', OLD."offset", 'finished', OLD.finished_at_ms IS NOT NULL));
        END IF;
        RETURN NULL;
    END IF;
    IF NOT NEW.announced THEN
        RETURN NULL;
    END IF;
    IF NOT OLD.announced THEN
        PERFORM ferry_emit_event('upload.created', NEW.principal, NEW.id,
            json_build_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset", 'metadata', NEW.metadata,
                              'concat', NEW.concat_kind, 'expires_at_ms', NEW.expires_at_ms));
        IF NEW.finished_at_ms IS NOT NULL THEN
            PERFORM ferry_emit_event('upload.finished', NEW.principal, NEW.id,
                json_build_object('upload', NEW.id, 'size', NEW.length, 'sha256', encode(NEW.sha256, 'hex'), 'metadata', NEW.metadata,
                                  'concat', NEW.concat_kind));
        END IF;
        RETURN NULL;
    END IF;
    IF OLD.finished_at_ms IS NULL AND NEW.finished_at_ms IS NOT NULL THEN
        PERFORM ferry_emit_event('upload.finished', NEW.principal, NEW.id,
            json_build_object('upload', NEW.id, 'size', NEW.length, 'sha256', encode(NEW.sha256, 'hex'), 'metadata', NEW.metadata,
                              'concat', NEW.concat_kind));
    END IF;
    IF NOT OLD.expired AND NEW.expired THEN
        PERFORM ferry_emit_event('upload.expired', NEW.principal, NEW.id,
            json_build_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset"));
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER events_uploads ON uploads;
CREATE CONSTRAINT TRIGGER events_uploads AFTER INSERT OR UPDATE OF finished_at_ms, expired, announced OR DELETE ON uploads
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ferry_upload_events();
