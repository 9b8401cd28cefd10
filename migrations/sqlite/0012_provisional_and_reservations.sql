-- Issue 23 items 4 and 7.
--
-- `announced`: 0 while a creation that carries bytes (creation-with-upload, `Upload-Length: 0`,
-- a task's output file) has not been answered yet. Such a row emits no event: if the request is
-- refused (its body fails a checksum, runs past its length, a hook refuses it…) the row is
-- deleted with no trace in the outbox (`withdraw`); once it is answered it is announced, and
-- `upload.created` (then `upload.finished`, when it already is) is written at that moment.
--
-- `reserved_to`, `reservation`: room a deferred-length upload (or a task's file) holds in its
-- principal's bytes quota while a writer adds bytes: the row counts max(offset, reserved_to)
-- until its length is known. Set under the same lock creation takes, so concurrent writers and
-- replicas can never together store more than the quota; `reservation` names the writer, so a
-- late release never frees the room of the next one.
ALTER TABLE uploads ADD COLUMN announced INTEGER NOT NULL DEFAULT 1;
ALTER TABLE uploads ADD COLUMN reserved_to INTEGER;
ALTER TABLE uploads ADD COLUMN reservation TEXT;

DROP TRIGGER events_upload_created;
CREATE TRIGGER events_upload_created AFTER INSERT ON uploads
WHEN NEW.announced <> 0
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.created', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset", 'metadata', NEW.metadata,
                    'concat', NEW.concat_kind, 'expires_at_ms', NEW.expires_at_ms));
END;

CREATE TRIGGER events_upload_announced AFTER UPDATE OF announced ON uploads
WHEN OLD.announced = 0 AND NEW.announced <> 0
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.created', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset", 'metadata', NEW.metadata,
                    'concat', NEW.concat_kind, 'expires_at_ms', NEW.expires_at_ms));
    INSERT INTO events (id, type, principal, subject, at_ms, body)
    SELECT 'evt_' || lower(hex(randomblob(16))), 'upload.finished', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'size', NEW.length, 'sha256', lower(hex(NEW.sha256)), 'metadata', NEW.metadata,
                    'concat', NEW.concat_kind)
    WHERE NEW.finished_at_ms IS NOT NULL;
END;

DROP TRIGGER events_upload_finished;
CREATE TRIGGER events_upload_finished AFTER UPDATE OF finished_at_ms ON uploads
WHEN OLD.finished_at_ms IS NULL AND NEW.finished_at_ms IS NOT NULL AND NEW.announced <> 0
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.finished', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'size', NEW.length, 'sha256', lower(hex(NEW.sha256)), 'metadata', NEW.metadata,
                    'concat', NEW.concat_kind));
END;

DROP TRIGGER events_upload_expired;
CREATE TRIGGER events_upload_expired AFTER UPDATE OF expired ON uploads
WHEN OLD.expired = 0 AND NEW.expired <> 0 AND NEW.announced <> 0
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.expired', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset"));
END;

-- Deleting a tombstone (already announced as expired) is housekeeping, not a change; deleting a
-- row never announced (a refused creation) is no change either.
DROP TRIGGER events_upload_terminated;
CREATE TRIGGER events_upload_terminated AFTER DELETE ON uploads
WHEN OLD.expired = 0 AND OLD.announced <> 0
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.terminated', OLD.principal, OLD.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', OLD.id, 'length', OLD.length, 'offset', OLD."offset", 'finished', json(CASE WHEN OLD.finished_at_ms IS NULL THEN 'false' ELSE 'true' END)));
END;
