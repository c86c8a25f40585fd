-- idem: the idempotency record table (MariaDB 10.5+ or MySQL 8.0.16+, InnoDB),
-- layout 1 (idem 0.1). The table's comment names its layout:
-- `MySqlStore::migrate()` refuses a table that exists with another (or none:
-- a build before 0.1), never reads it, and never alters it.
--
-- `{table}` is a placeholder for the (validated, backtick-quoted) table name,
-- in the connection's database. Default: `idem_records`. The statement is
-- idempotent, so this file can be run again safely, by
-- `MySqlStore::migrate()` or by your own migration tool.
-- All times are Unix milliseconds decided by the engine, never `NOW()`.
--
-- Byte-exact identities: owner, operation and key are VARBINARY, compared
-- byte for byte (`order-A` and `order-a` are two records, and so are `a` and
-- `a ` with a trailing space: a PAD SPACE collation such as MariaDB's
-- `utf8mb4_bin` would make those equal).
--
-- The primary key is compact: `id`, the first 16 bytes of the SHA-256 of the
-- record's identity (see `RecordId::digest`); the owner, operation and key
-- are stored beside it and checked on every read, so two identities sharing
-- an `id` are a typed error, never a wrong replay.
--
-- One index besides the primary key, on `sweep_at`, a column a completion
-- never changes (a completion touches no secondary index). InnoDB appends the
-- primary key to every secondary index, so the index orders (sweep_at, id):
-- the purge and the stuck-record listing walk it in keyset order. An in-flight record's `sweep_at` is its lease end;
-- a purge moves every other record it passes to the time it next has
-- something to do (its body's expiry, else its key's).

CREATE TABLE IF NOT EXISTS {table} (
    id                  BINARY(16)      NOT NULL,
    owner               VARBINARY(1024) NOT NULL,
    operation           VARBINARY(1024) NOT NULL,
    `key`               VARBINARY(255)  NOT NULL,
    fingerprint         VARBINARY(32)   NOT NULL,
    state               VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token               BIGINT          NOT NULL,
    attempt             INT             NOT NULL,
    lease_until         BIGINT          NOT NULL,
    resource_id         TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    outcome             VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL,
    response            LONGBLOB        NULL,
    response_expires_at BIGINT          NULL,
    key_expires_at      BIGINT          NOT NULL,
    sweep_at            BIGINT          NOT NULL,
    PRIMARY KEY (id),
    KEY sweep_idx (sweep_at),
    CHECK (state IN ('in_flight', 'released', 'completed')),
    CHECK (outcome IN ('success', 'failure', 'not_stored')),
    CHECK (LENGTH(fingerprint) = 32)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin ROW_FORMAT = DYNAMIC
  COMMENT = 'idem layout 1'
