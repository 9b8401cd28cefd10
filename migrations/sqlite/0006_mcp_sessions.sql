-- MCP sessions of clients that speak a protocol before 2026-07-28 (which has no sessions):
-- the client's `initialize` parameters (JSON), so any replica can restore the session
-- (src/mcp/sessions.rs). Rows not used for a week are forgotten by the sweeper.
CREATE TABLE mcp_sessions (
    id          TEXT PRIMARY KEY NOT NULL,
    state       TEXT NOT NULL,
    used_at_ms  INTEGER NOT NULL
);
CREATE INDEX mcp_sessions_used ON mcp_sessions (used_at_ms);
