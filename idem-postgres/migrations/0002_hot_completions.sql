-- idem: completions as HOT updates (applies to tables made by 0001).
--
-- A completion sets the state, the outcome, the body and both expiries. While
-- any index covers one of those columns (or names one in its predicate),
-- Postgres cannot update the row in place (a HOT update): it writes a new
-- tuple and a new entry in every index. 0001 indexed `key_expires_at`,
-- `response_expires_at` (where the body is set) and `lease_until` (where the
-- state is in flight), so no completion was HOT.
--
-- From here on the table has one index besides the primary key, on
-- `sweep_at`, a column the completion never changes:
--
-- * a claim (and a lease extension or an operator release) sets it to the
--   lease end, so an in-flight record's `sweep_at` is its `lease_until`: the
--   stuck list walks this index in `lease_until` order;
-- * a purge walks the index up to `now`: it deletes expired keys, drops
--   expired bodies, and moves every other record it passes to the time it
--   next has something to do (the body's expiry, else the key's). So each
--   completed record is re-filed once, by the purge, off the request path,
--   instead of at every completion.
--
-- Upgrading an existing table (run by `PgStore::migrate`, in its transaction,
-- idempotent): the column is added with the default 0 (no table rewrite), so
-- every existing record is due at the first purges, which re-file them in
-- batches; in-flight records get their lease end right away (through the old
-- in-flight index, before it goes). The old indexes are then dropped.
-- `CREATE INDEX` here locks writes while it builds: on a large table, create
-- "{prefix}_sweep_idx" yourself with CREATE INDEX CONCURRENTLY first (after
-- adding the column), and this step finds it.

DO $idem$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = '{schema}.{table}'::regclass AND attname = 'sweep_at' AND NOT attisdropped
    ) THEN
        ALTER TABLE {schema}.{table} ADD COLUMN sweep_at bigint NOT NULL DEFAULT 0;
        UPDATE {schema}.{table} SET sweep_at = lease_until WHERE state = 'in_flight';
    END IF;
END
$idem$;

-- Made only when absent: `CREATE INDEX IF NOT EXISTS` would take its lock
-- (which waits for, and then blocks, every write) even when the index
-- exists, so running this file again on a live table would stall writes.
DO $idem$
BEGIN
    IF to_regclass('{schema}."{prefix}_sweep_idx"') IS NULL THEN
        CREATE INDEX "{prefix}_sweep_idx"
            ON {schema}.{table} (sweep_at, owner, operation, key);
    END IF;
END
$idem$;

DROP INDEX IF EXISTS {schema}."{prefix}_key_expires_idx";
DROP INDEX IF EXISTS {schema}."{prefix}_response_expires_idx";
DROP INDEX IF EXISTS {schema}."{prefix}_in_flight_idx";
