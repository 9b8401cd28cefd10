-- Retention of finished files (issue 13 item 4): the sweeper lists live finished uploads by
-- finish time; quotas sum a principal's live uploads (uploads_principal serves that).
CREATE INDEX uploads_finished ON uploads (finished_at_ms) WHERE finished_at_ms IS NOT NULL AND expired = 0;
