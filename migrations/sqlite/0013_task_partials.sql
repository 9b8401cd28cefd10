-- Partial results (issue 27): small JSON fragments a task appends while it works, read before it
-- ends. `seq` numbers a task's fragments from 1 and never repeats; the oldest are deleted past the
-- bound (256 fragments or 64 KiB of views, src/catalog/partials.rs), counted in
-- `tasks.partial_dropped`. `tasks.partial_seq` is the last seq handed out; `partial_mark` is the
-- seq the last checkpoint covered: a resumed run numbers its fragments from there, and one whose
-- seq is already taken is a replay of a fragment stored before the crash, not a new one.
CREATE TABLE task_partials (
    task_id TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    at_ms   INTEGER NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
);
ALTER TABLE tasks ADD COLUMN partial_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN partial_dropped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN partial_mark INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER task_partials_swept AFTER DELETE ON tasks
BEGIN
    DELETE FROM task_partials WHERE task_id = OLD.id;
END;

-- `task.partial` carries the fragment (DESIGN §8: written in the transaction that appends it).
CREATE TRIGGER events_task_partial AFTER INSERT ON task_partials
BEGIN
    INSERT INTO events (id, type, principal, subject, at_ms, body)
    SELECT 'evt_' || lower(hex(randomblob(16))), 'task.partial', t.principal, t.id,
        CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER),
        json_object('task', t.id, 'kind', t.kind, 'seq', NEW.seq, 'at_ms', NEW.at_ms, 'value', json(NEW.value))
    FROM tasks t WHERE t.id = NEW.task_id;
END;
