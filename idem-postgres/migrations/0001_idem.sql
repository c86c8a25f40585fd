-- idem: the idempotency record table (PostgreSQL 13+).
--
-- `{schema}` and `{table}` are placeholders for the (validated, quoted)
-- schema and table names; `{prefix}` is the unquoted table name, used to name
-- the indexes and constraints. Defaults: schema "public", table "idem_records".
-- Every statement is idempotent, so this file can be run again safely, by
-- `PgStore::migrate()` (in one transaction) or by your own migration tool.
-- All times are Unix milliseconds decided by the engine, never `now()`.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.{table} (
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
    CONSTRAINT "{prefix}_pkey" PRIMARY KEY (owner, operation, key),
    CONSTRAINT "{prefix}_state_check" CHECK (state IN ('in_flight', 'released', 'completed')),
    CONSTRAINT "{prefix}_outcome_check" CHECK (outcome IN ('success', 'failure', 'not_stored')),
    CONSTRAINT "{prefix}_fingerprint_check" CHECK (octet_length(fingerprint) = 32)
);

-- The expiry and in-flight indexes of this first version. 0002 replaces
-- them with one sweep index and adds the `sweep_at` column: on a table that
-- has it they are not made again (running this file again must not rebuild,
-- under a lock that blocks writes, three indexes the next file drops).
DO $idem$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = '{schema}.{table}'::regclass AND attname = 'sweep_at' AND NOT attisdropped
    ) THEN
        -- Purging expired keys walks this index, never the table.
        CREATE INDEX IF NOT EXISTS "{prefix}_key_expires_idx"
            ON {schema}.{table} (key_expires_at);
        -- Dropping expired bodies walks this one; rows whose body is gone leave it.
        CREATE INDEX IF NOT EXISTS "{prefix}_response_expires_idx"
            ON {schema}.{table} (response_expires_at) WHERE response IS NOT NULL;
        -- Operators list records stuck in flight through this one, in keyset
        -- order (added with the operator API; `IF NOT EXISTS` adds it to an
        -- existing first-version table on the next migrate).
        CREATE INDEX IF NOT EXISTS "{prefix}_in_flight_idx"
            ON {schema}.{table} (lease_until, owner, operation, key) WHERE state = 'in_flight';
    END IF;
END
$idem$;
