-- Events (DESIGN §8), the PostgreSQL twin of migrations/sqlite/0005_events.sql: the outbox.
-- Triggers write one row per change in the same transaction as the change itself, whichever
-- code path makes it, so a crash can neither lose an event nor announce a change that was
-- rolled back. `id` is the event's one id for life (the webhook-id and the SSE id); `subject`
-- is the upload or task the event is about. Bodies are small JSON: handles, sizes, hashes.
--
-- Order. `seq` must be commit order, so that a reader that has seen seq N never later finds a
-- smaller one committed (SSE cursors, webhook cursors). Every transaction that writes an event
-- takes one transaction-scoped advisory lock before drawing its seq and holds it to commit:
-- event-writing transactions commit one at a time (they are single short statements), and a
-- commit is visible before the lock is released.
CREATE TABLE events (
    seq       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id        TEXT NOT NULL UNIQUE,
    type      TEXT NOT NULL,
    principal TEXT NOT NULL,
    subject   TEXT NOT NULL,
    at_ms     BIGINT NOT NULL,
    body      TEXT NOT NULL
);
CREATE INDEX events_principal ON events (principal, seq);
CREATE INDEX events_at ON events (at_ms);

CREATE FUNCTION ferry_emit_event(etype TEXT, principal TEXT, subject TEXT, body JSON) RETURNS VOID
    LANGUAGE plpgsql AS $$
BEGIN
    -- 'ferry.outbox' as a 64-bit key; see the note on order above.
    PERFORM pg_advisory_xact_lock(hashtextextended('ferry.outbox', 0));
    INSERT INTO events (id, type, principal, subject, at_ms, body)
    VALUES ('evt_' || replace(gen_random_uuid()::text, '-', ''), etype, principal, subject, ferry_now_ms(), body::text);
END $$;

CREATE FUNCTION ferry_upload_events() RETURNS TRIGGER
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM ferry_emit_event('upload.created', NEW.principal, NEW.id,
            json_build_object('upload', NEW.id, 'length', NEW.length, 'offset', NEW."offset", 'metadata', NEW.metadata,
                              'concat', NEW.concat_kind, 'expires_at_ms', NEW.expires_at_ms));
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        -- Deleting a tombstone (already announced as expired) is housekeeping, not a change.
        IF NOT OLD.expired THEN
            PERFORM ferry_emit_event('upload.terminated', OLD.principal, OLD.id,
                json_build_object('upload', OLD.id, 'length', OLD.length, 'offset', OLD."offset", 'finished', OLD.finished_at_ms IS NOT NULL));
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

CREATE TRIGGER events_uploads AFTER INSERT OR UPDATE OF finished_at_ms, expired OR DELETE ON uploads
    FOR EACH ROW EXECUTE FUNCTION ferry_upload_events();

CREATE FUNCTION ferry_task_events() RETURNS TRIGGER
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM ferry_emit_event('task.status_changed', NEW.principal, NEW.id,
            json_build_object('task', NEW.id, 'kind', NEW.kind, 'status', NEW.status, 'previous_status', NULL,
                              'status_message', NEW.status_message, 'prior_failure', NEW.prior_failure));
    ELSIF OLD.status <> NEW.status THEN
        PERFORM ferry_emit_event('task.status_changed', NEW.principal, NEW.id,
            json_build_object('task', NEW.id, 'kind', NEW.kind, 'status', NEW.status, 'previous_status', OLD.status,
                              'status_message', NEW.status_message, 'result', NEW.result::json, 'error', NEW.error::json));
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER events_tasks AFTER INSERT OR UPDATE OF status ON tasks
    FOR EACH ROW EXECUTE FUNCTION ferry_task_events();

-- Webhook delivery (DESIGN §8). A cursor per configured webhook: the last event seq it has
-- turned into deliveries. A delivery is one (webhook, event); it keeps the event's id for every
-- attempt. `state`: pending (due at next_attempt_ms), delivered, failed (gave up). Replicas
-- claim due deliveries with a lease (FOR UPDATE SKIP LOCKED), so no two send one at once.
CREATE TABLE webhook_cursors (
    webhook  TEXT PRIMARY KEY NOT NULL,
    last_seq BIGINT NOT NULL
);
CREATE TABLE webhook_deliveries (
    webhook          TEXT NOT NULL,
    event_seq        BIGINT NOT NULL,
    subject          TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         BIGINT NOT NULL DEFAULT 0,
    created_at_ms    BIGINT NOT NULL,
    next_attempt_ms  BIGINT NOT NULL,
    last_attempt_ms  BIGINT,
    last_status      BIGINT,
    last_error       TEXT,
    lease_owner      TEXT,
    lease_expires_ms BIGINT,
    PRIMARY KEY (webhook, event_seq)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_ms);
CREATE INDEX webhook_deliveries_subject ON webhook_deliveries (webhook, subject, event_seq) WHERE state = 'pending';
