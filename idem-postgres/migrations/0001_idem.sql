-- idem: the idempotency record table (PostgreSQL 13+), layout 1 (idem 0.1).
--
-- `{schema}` and `{table}` are placeholders for the (validated, quoted)
-- schema and table names; `{prefix}` is the unquoted table name, used to name
-- the indexes and constraints. Defaults: schema "public", table "idem_records".
-- Every statement is idempotent, so this file can be run again safely, by
-- `PgStore::migrate()` (in one transaction) or by your own migration tool.
-- All times are Unix milliseconds decided by the engine, never `now()`.
--
-- The table's comment names its layout; a table that exists with another
-- (or none: a build before 0.1) is refused, by `PgStore::migrate()` with a
-- typed error before this file runs and by this file itself, never read.
--
-- The primary key is compact: `id`, the first 16 bytes of the SHA-256 of
-- the record's identity (owner, operation and key, length-prefixed; see
-- `RecordId::digest`). The owner, operation and key are stored beside it and
-- checked on every read, so two identities sharing an `id` are a typed
-- error, never a wrong replay.
--
-- No CHECK constraints. Every value is written by the store, and every read
-- checks what it reads (the identity, the state, the outcome, the lengths of
-- the key and the fingerprint): a row it cannot read is a typed error, never
-- a wrong answer. A CHECK would cost every statement that writes a row:
-- Postgres rebuilds a table's constraint expressions from their stored text
-- for each such statement (measured: 8% of the server's CPU for a fresh
-- key).
--
-- One index besides the primary key, on `sweep_at`, a column a completion
-- never changes: a completion sets the state, the outcome, the body and both
-- expiries, touches no indexed column, and so is a HOT update (the row is
-- rewritten in place, no index entry is written).
--
-- * a claim (and a lease extension or an operator release) sets `sweep_at`
--   to the lease end, so an in-flight record's `sweep_at` is its
--   `lease_until`: the stuck list walks this index in `lease_until` order;
-- * a purge walks the index up to `now`: it deletes expired keys, drops
--   expired bodies, and moves every other record it passes to the time it
--   next has something to do (the body's expiry, else the key's). So each
--   completed record is re-filed once, by the purge, off the request path,
--   instead of at every completion.

CREATE SCHEMA IF NOT EXISTS {schema};

-- A table that exists must already be of this layout: this file never
-- alters, and never marks, a table of another (or of none).
DO $idem$
BEGIN
    IF to_regclass('{schema}.{table}') IS NOT NULL
       AND obj_description(to_regclass('{schema}.{table}'), 'pg_class') IS DISTINCT FROM 'idem layout 1' THEN
        RAISE EXCEPTION 'idem: the table {schema}.{table} exists but is not in idem layout 1; use another table';
    END IF;
END
$idem$;

CREATE TABLE IF NOT EXISTS {schema}.{table} (
    id                  bytea   NOT NULL,
    owner               text    NOT NULL,
    operation           text    NOT NULL,
    key                 text    NOT NULL,
    fingerprint         bytea   NOT NULL,
    state               text    NOT NULL,
    token               bigint  NOT NULL,
    attempt             integer NOT NULL,
    lease_until         bigint  NOT NULL,
    resource_id         text,
    outcome             text,
    response            bytea,
    response_expires_at bigint,
    key_expires_at      bigint  NOT NULL,
    sweep_at            bigint  NOT NULL,
    CONSTRAINT "{prefix}_pkey" PRIMARY KEY (id)
);

COMMENT ON TABLE {schema}.{table} IS 'idem layout 1';

-- Made only when absent: `CREATE INDEX IF NOT EXISTS` would take its lock
-- (which waits for, and then blocks, every write) even when the index
-- exists, so running this file again on a live table would stall writes.
-- On a large table of your own, create it with CREATE INDEX CONCURRENTLY
-- first, and this step finds it.
DO $idem$
BEGIN
    IF to_regclass('{schema}."{prefix}_sweep_idx"') IS NULL THEN
        CREATE INDEX "{prefix}_sweep_idx"
            ON {schema}.{table} (sweep_at, id);
    END IF;
END
$idem$;
