-- idem: one sweep index instead of three (applies to a database made by 0001).
--
-- A completion sets the state, the outcome, the body and both expiries; while
-- indexes covered `key_expires_at`, `response_expires_at` (where the body is
-- set) and `lease_until` (where the state is in flight), each completion
-- rewrote an entry in all three, and each fresh key wrote four b-trees at its
-- claim and four more at its completion. From here on the table has one index
-- besides the primary key, on `sweep_at`, a column the completion never
-- changes (the same plan as the Postgres backend's 0002):
--
-- * a claim (and a lease extension, a takeover or an operator release) sets
--   it to the lease end, so an in-flight record's `sweep_at` is its
--   `lease_until`: the stuck list walks this index in `lease_until` order;
-- * a purge walks the index up to `now`: it deletes expired keys, drops
--   expired bodies, and moves every other record it passes to the time it
--   next has something to do (the body's expiry, else the key's). So each
--   completed record is re-filed once, by a purge, off the request path.
--
-- Run it once (`SqliteStore::migrate` runs it, in the same transaction as
-- 0001, only on a table without `sweep_at`). The column is added with the
-- default 0, so every existing record is due at the first purges, which
-- re-file them in batches; in-flight records get their lease end right away.

ALTER TABLE {table} ADD COLUMN sweep_at INTEGER NOT NULL DEFAULT 0;
UPDATE {table} SET sweep_at = lease_until WHERE state = 'in_flight';

CREATE INDEX IF NOT EXISTS "{prefix}_sweep"
    ON {table} (sweep_at, owner, operation, key);

DROP INDEX IF EXISTS "{prefix}_key_expiry";
DROP INDEX IF EXISTS "{prefix}_response_expiry";
DROP INDEX IF EXISTS "{prefix}_in_flight";
