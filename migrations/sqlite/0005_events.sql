-- Events (DESIGN §8): the outbox. Triggers write one row per change in the same transaction
-- as the change itself, whichever code path makes it, so a crash can neither lose an event nor
-- announce a change that was rolled back. `id` is the event's one id for life (the webhook-id
-- and the SSE id); `seq` orders events (commit order: SQLite serialises writers); `subject` is
-- the upload or task the event is about. Bodies are small JSON: handles, sizes, hashes.
CREATE TABLE events (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    id        TEXT NOT NULL UNIQUE,
    type      TEXT NOT NULL,
    principal TEXT NOT NULL,
    subject   TEXT NOT NULL,
    at_ms     INTEGER NOT NULL,
    body      TEXT NOT NULL
);
CREATE INDEX events_principal ON events (principal, seq);
CREATE INDEX events_at ON events (at_ms);

CREATE TRIGGER events_upload_created AFTER INSERT ON uploads
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.created', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset", 'metadata', NEW.metadata,
                    'concat', NEW.concat_kind, 'expires_at_ms', NEW.expires_at_ms));
END;

CREATE TRIGGER events_upload_finished AFTER UPDATE OF finished_at_ms ON uploads
WHEN OLD.finished_at_ms IS NULL AND NEW.finished_at_ms IS NOT NULL
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.finished', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'size', NEW.length, 'sha256', lower(hex(NEW.sha256)), 'metadata', NEW.metadata,
                    'concat', NEW.concat_kind));
END;

CREATE TRIGGER events_upload_expired AFTER UPDATE OF expired ON uploads
WHEN OLD.expired = 0 AND NEW.expired <> 0
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.expired', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset"));
END;

-- Deleting a tombstone (already announced as expired) is housekeeping, not a change.
CREATE TRIGGER events_upload_terminated AFTER DELETE ON uploads
WHEN OLD.expired = 0
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'upload.terminated', OLD.principal, OLD.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('upload', OLD.id, 'length', OLD.length, 'offset', OLD."offset", 'finished', json(CASE WHEN OLD.finished_at_ms IS NULL THEN 'false' ELSE 'true' END)));
END;

CREATE TRIGGER events_task_created AFTER INSERT ON tasks
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'task.status_changed', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('task', NEW.id, 'kind', NEW.kind, 'status', NEW.status, 'previous_status', NULL,
                    'status_message', NEW.status_message, 'prior_failure', NEW.prior_failure));
END;

CREATE TRIGGER events_task_status AFTER UPDATE OF status ON tasks
WHEN OLD.status <> NEW.status
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body) VALUES (
        'evt_' || lower(hex(randomblob(16))), 'task.status_changed', NEW.principal, NEW.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('task', NEW.id, 'kind', NEW.kind, 'status', NEW.status, 'previous_status', OLD.status,
                    'status_message', NEW.status_message, 'result', json(NEW.result), 'error', json(NEW.error)));
END;

-- Webhook delivery (DESIGN §8). A cursor per configured webhook: the last event seq it has
-- turned into deliveries. A delivery is one (webhook, event); it keeps the event's id for every
-- attempt. `state`: pending (due at next_attempt_ms), delivered, failed (gave up).
CREATE TABLE webhook_cursors (
    webhook  TEXT PRIMARY KEY NOT NULL,
    last_seq INTEGER NOT NULL
);
CREATE TABLE webhook_deliveries (
    webhook          TEXT NOT NULL,
    event_seq        INTEGER NOT NULL,
    subject          TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at_ms    INTEGER NOT NULL,
    next_attempt_ms  INTEGER NOT NULL,
    last_attempt_ms  INTEGER,
    last_status      INTEGER,
    last_error       TEXT,
    lease_owner      TEXT,
    lease_expires_ms INTEGER,
    PRIMARY KEY (webhook, event_seq)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_ms);
CREATE INDEX webhook_deliveries_subject ON webhook_deliveries (webhook, subject, event_seq) WHERE state = 'pending';
