-- idem: one row per (owner, operation, key), layout 1 (idem 0.1).
-- The primary key is compact: `id`, the first 16 bytes of the SHA-256 of the
-- record's identity (see `RecordId::digest`); the owner, operation and key
-- are stored beside it and checked on every read.
-- Idempotent: safe to run on every start.
-- The table's name is a placeholder, in braces: `table` for the (validated,
-- quoted) name, `prefix` for the bare name that starts the index names.
-- `SqliteStore::migration_sql()` fills them in.
-- Times are Unix milliseconds from the engine's clock; the token is the
-- fencing token of the attempt that holds (or last held) the record.
--
-- The layout's mark is the comment on the table's first line: SQLite keeps
-- the text of the `CREATE TABLE` (in `sqlite_schema`), and
-- `SqliteStore::migrate()` reads it back, refusing a table that exists
-- without it (a build before 0.1, or a table of something else).
--
-- One index besides the primary key, on `sweep_at`, a column a completion
-- never changes (a completion writes the table and no index):
--
-- * a claim (and a lease extension, a takeover or an operator release) sets
--   it to the lease end, so an in-flight record's `sweep_at` is its
--   `lease_until`: the stuck list walks this index in `lease_until` order;
-- * a purge walks the index up to `now`: it deletes expired keys, drops
--   expired bodies, and moves every other record it passes to the time it
--   next has something to do (the body's expiry, else the key's). So each
--   completed record is re-filed once, by a purge, off the request path.
CREATE TABLE IF NOT EXISTS {table} ( -- idem layout 1
    id                  BLOB    NOT NULL PRIMARY KEY CHECK (length(id) = 16),
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
    sweep_at            INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS "{prefix}_sweep"
    ON {table} (sweep_at, id);
