-- The PostgreSQL twin of migrations/sqlite/0006_mcp_sessions.sql: MCP sessions of clients
-- that speak a protocol before 2026-07-28, restorable by any replica.
CREATE TABLE mcp_sessions (
    id          TEXT PRIMARY KEY NOT NULL,
    state       TEXT NOT NULL,
    used_at_ms  BIGINT NOT NULL
);
CREATE INDEX mcp_sessions_used ON mcp_sessions (used_at_ms);
