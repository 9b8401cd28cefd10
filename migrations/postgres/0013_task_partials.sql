-- Partial results (issue 27); the PostgreSQL twin of migrations/sqlite/0013 (see there).
CREATE TABLE task_partials (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq     BIGINT NOT NULL,
    at_ms   BIGINT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
);
ALTER TABLE tasks ADD COLUMN partial_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN partial_dropped BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN partial_mark BIGINT NOT NULL DEFAULT 0;

-- `task.partial` carries the fragment. A constraint trigger deferred to commit, like the others
-- since 0011, so the outbox lock is held only while committing.
CREATE FUNCTION ferry_task_partial_events() RETURNS TRIGGER
    LANGUAGE plpgsql AS $$
DECLARE
    t RECORD;
BEGIN
    SELECT id, principal, kind INTO t FROM tasks WHERE id = NEW.task_id;
    IF FOUND THEN
        PERFORM ferry_emit_event('task.partial', t.principal, t.id,
            json_build_object('task', t.id, 'kind', t.kind, 'seq', NEW.seq, 'at_ms', NEW.at_ms, 'value', NEW.value::json));
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER events_task_partials AFTER INSERT ON task_partials
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ferry_task_partial_events();
