-- The outbox lock at commit (issue 23, kind 8). 0005 took 'ferry.outbox' (the advisory lock
-- that makes event seqs commit order) in row triggers that fire at the statement making the
-- change, so a transaction held the one outbox lock of the whole catalog across everything it
-- did after that statement (a creation's quota SUM over the principal's uploads, a task's
-- further updates): every other event-writing transaction, of any principal and replica,
-- waited for it. The same triggers as constraint triggers deferred to commit take the lock
-- last: a transaction holds it only while its events are written and it commits. A trigger
-- sees the row as its change left it, so the bodies are those 0005 wrote.
DROP TRIGGER events_uploads ON uploads;
CREATE CONSTRAINT TRIGGER events_uploads AFTER INSERT OR UPDATE OF finished_at_ms, expired OR DELETE ON uploads
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ferry_upload_events();

DROP TRIGGER events_tasks ON tasks;
CREATE CONSTRAINT TRIGGER events_tasks AFTER INSERT OR UPDATE OF status ON tasks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ferry_task_events();
