-- Durable tasks (DESIGN §4), the PostgreSQL twin of migrations/sqlite/0002_tasks.sql.
-- JSON columns are TEXT, not JSONB: the catalog returns exactly the text it was given
-- (JSONB would reorder keys and drop duplicate ones). Times are Unix ms.
CREATE TABLE tasks (
    id               TEXT PRIMARY KEY NOT NULL,
    principal        TEXT NOT NULL,
    kind             TEXT NOT NULL,
    args             TEXT NOT NULL,
    idempotency_key  TEXT,
    status           TEXT NOT NULL CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    status_message   TEXT,
    progress         TEXT NOT NULL DEFAULT '{}',
    checkpoint       TEXT,
    input_requests   TEXT NOT NULL DEFAULT '{}',
    input_responses  TEXT NOT NULL DEFAULT '{}',
    result           TEXT,
    error            TEXT,
    prior_failure    TEXT,
    created_at_ms    BIGINT NOT NULL,
    updated_at_ms    BIGINT NOT NULL,
    ttl_ms           BIGINT NOT NULL,
    lease_owner      TEXT,
    lease_expires_ms BIGINT,
    fence            BIGINT NOT NULL DEFAULT 0,
    runs             BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX tasks_runnable ON tasks (status, lease_expires_ms);
CREATE INDEX tasks_principal ON tasks (principal, created_at_ms);

-- Idempotency keys: the task a (principal, kind, key) currently names.
CREATE TABLE task_keys (
    principal TEXT NOT NULL,
    kind      TEXT NOT NULL,
    key       TEXT NOT NULL,
    task_id   TEXT NOT NULL,
    PRIMARY KEY (principal, kind, key)
);
