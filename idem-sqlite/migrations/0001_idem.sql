-- idem: one row per (owner, operation, key), layout 1 (idem 0.1).
-- The primary key is compact: `id`, the first 16 bytes of the SHA-256 of the
-- record's identity (see `RecordId::digest`); the owner, operation and key
-- are stored beside it and checked on every read.
-- Idempotent: safe to run on every start.
-- The table's name is a placeholder, in braces: `table` for the (validated,
-- quoted) name. `SqliteStore::migration_sql()` fills it in.
-- Times are Unix milliseconds from the engine's clock; the token is the
-- fencing token of the attempt that holds (or last held) the record.
--
-- The layout's mark is the comment on the table's first line: SQLite keeps
-- the text of the `CREATE TABLE` (in `sqlite_schema`), and
-- `SqliteStore::migrate()` reads it back, refusing a table that exists
-- without it (a build before 0.1, or a table of something else).
--
-- No index besides the primary key: a claim writes the table and the
-- primary key, a completion the table alone, as a hand-written table of
-- keys would. A purge reads the table in `rowid` order, outside the write
-- lock, and deletes or trims what it found in short write transactions; the
-- stuck list reads it in full and sorts by lease end. Both cost a read of
-- the table, which an embedded store's size keeps short (measured in
-- `benches/README.md`); neither is on the request path.
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
    key_expires_at      INTEGER NOT NULL
);
