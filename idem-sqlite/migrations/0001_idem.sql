-- idem: one row per (owner, operation, key). Idempotent: safe to run on every start.
-- The table's name is a placeholder, in braces: `table` for the (validated,
-- quoted) name, `prefix` for the bare name that starts the index names.
-- `SqliteStore::migration_sql()` fills them in.
-- Times are Unix milliseconds from the engine's clock; the token is the
-- fencing token of the attempt that holds (or last held) the record.
CREATE TABLE IF NOT EXISTS {table} (
    owner               TEXT    NOT NULL,
    operation           TEXT    NOT NULL,
    key                 TEXT    NOT NULL,
    fingerprint         BLOB    NOT NULL,
    state               TEXT    NOT NULL,
    token               INTEGER NOT NULL,
    attempt             INTEGER NOT NULL,
    lease_until         INTEGER NOT NULL,
    takeover            TEXT,
    resource_id         TEXT,
    outcome             TEXT,
    response            BLOB,
    response_expires_at INTEGER,
    key_expires_at      INTEGER NOT NULL,
    PRIMARY KEY (owner, operation, key)
);

-- Purges find expired keys and expired bodies through these, never by scanning.
-- (0002 replaces these three indexes with one sweep index.)
CREATE INDEX IF NOT EXISTS "{prefix}_key_expiry"
    ON {table} (key_expires_at);
CREATE INDEX IF NOT EXISTS "{prefix}_response_expiry"
    ON {table} (response_expires_at) WHERE response IS NOT NULL;

-- Operators list records stuck in flight through this one, in keyset order
-- (added with the operator API; `CREATE … IF NOT EXISTS` adds it to an
-- existing database on the next migrate).
CREATE INDEX IF NOT EXISTS "{prefix}_in_flight"
    ON {table} (lease_until, owner, operation, key) WHERE state = 'in_flight';
