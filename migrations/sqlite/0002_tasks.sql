-- Durable tasks (DESIGN §4). JSON columns hold exact JSON text; times are Unix ms.
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
    created_at_ms    INTEGER NOT NULL,
    updated_at_ms    INTEGER NOT NULL,
    ttl_ms           INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_ms INTEGER,
    fence            INTEGER NOT NULL DEFAULT 0,
    runs             INTEGER NOT NULL DEFAULT 0
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
