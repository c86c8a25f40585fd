//! The shipped migration and the statements, all fixed at compile time.

/// The schema for your own migration tool: `migrations/0001_idem.sql`
/// followed by `migrations/0002_sweep.sql`, to run **once** on a new
/// database. A database made by 0001 alone needs 0002 once.
/// [`SqliteStore::migrate`](crate::SqliteStore::migrate) does this for you,
/// at every start, and runs each part only when the table lacks it.
pub const MIGRATION: &str = concat!(
    include_str!("../migrations/0001_idem.sql"),
    "\n",
    include_str!("../migrations/0002_sweep.sql")
);

/// The first version's DDL (idempotent).
pub(crate) const MIGRATION_0001: &str = include_str!("../migrations/0001_idem.sql");

/// The upgrade to the sweep index (once, on a table without `sweep_at`).
pub(crate) const MIGRATION_0002: &str = include_str!("../migrations/0002_sweep.sql");

/// Whether the table has had 0002.
pub(crate) const HAS_SWEEP: &str =
    "SELECT EXISTS (SELECT 1 FROM pragma_table_info('idem_records') WHERE name = 'sweep_at')";

/// The claim (`?1` owner, `?2` operation, `?3` key, `?4` fingerprint,
/// `?5` token, `?6` lease end, `?7` key expiry, `?8` now; times in Unix ms):
/// insert when absent; overwrite when the key expired (and no lease holds:
/// an in-flight record is never expired while `lease_until > now`); take
/// over a released record or an expired lease with the same fingerprint.
/// The key is kept at least until the new lease ends
/// (`key_expires_at = MAX(key_expires_at, lease_until)`). Returns a row only
/// when the caller won. `?8` is the engine's `now`. An in-flight record's
/// `sweep_at` is its lease end (see `migrations/0002_sweep.sql`).
pub const CLAIM: &str = "
INSERT INTO idem_records
    (owner, operation, key, fingerprint, state, token, attempt, lease_until,
     takeover, resource_id, outcome, response, response_expires_at, key_expires_at, sweep_at)
VALUES (?1, ?2, ?3, ?4, 'in_flight', ?5, 1, ?6, NULL, NULL, NULL, NULL, NULL, MAX(?7, ?6), ?6)
ON CONFLICT (owner, operation, key) DO UPDATE SET
    takeover = CASE
        WHEN (idem_records.key_expires_at <= ?8 AND (idem_records.state <> 'in_flight' OR idem_records.lease_until <= ?8)) THEN NULL
        WHEN idem_records.state = 'released' THEN 'released'
        ELSE 'lease_expired' END,
    attempt = CASE WHEN (idem_records.key_expires_at <= ?8 AND (idem_records.state <> 'in_flight' OR idem_records.lease_until <= ?8)) THEN 1 ELSE idem_records.attempt + 1 END,
    resource_id = CASE WHEN (idem_records.key_expires_at <= ?8 AND (idem_records.state <> 'in_flight' OR idem_records.lease_until <= ?8)) THEN NULL ELSE idem_records.resource_id END,
    key_expires_at = CASE WHEN (idem_records.key_expires_at <= ?8 AND (idem_records.state <> 'in_flight' OR idem_records.lease_until <= ?8))
        THEN excluded.key_expires_at ELSE MAX(idem_records.key_expires_at, excluded.lease_until) END,
    fingerprint = excluded.fingerprint,
    state = 'in_flight',
    token = excluded.token,
    lease_until = excluded.lease_until,
    sweep_at = excluded.lease_until,
    outcome = NULL,
    response = NULL,
    response_expires_at = NULL
WHERE (idem_records.key_expires_at <= ?8 AND (idem_records.state <> 'in_flight' OR idem_records.lease_until <= ?8))
   OR (idem_records.fingerprint = excluded.fingerprint
       AND (idem_records.state = 'released'
            OR (idem_records.state = 'in_flight' AND idem_records.lease_until <= ?8)))
RETURNING attempt, takeover, resource_id";

/// Reads a live record (`?1`–`?3` the record, `?4` now): its key has not
/// expired, or it is in flight under a lease; the body only while
/// `now < response_expires_at`.
pub const FETCH: &str = "
SELECT fingerprint, state, attempt, lease_until, resource_id, outcome,
       CASE WHEN response_expires_at > ?4 THEN response END AS response,
       response_expires_at, key_expires_at
FROM idem_records
WHERE owner = ?1 AND operation = ?2 AND key = ?3
  AND (key_expires_at > ?4 OR (state = 'in_flight' AND lease_until > ?4))";

/// Every guarded write ends with this condition on `?1..?4`.
macro_rules! guarded {
    ($set:literal) => {
        concat!(
            "UPDATE idem_records SET ",
            $set,
            " WHERE owner = ?1 AND operation = ?2 AND key = ?3 AND token = ?4 AND state = 'in_flight'"
        )
    };
}

/// The completion: `?1`–`?4` the record and token, `?5` outcome, `?6` body,
/// `?7` response expiry, `?8` key expiry, `?9` resource id or NULL. It
/// changes no indexed column, so it rewrites the table's page and no index
/// (the record is re-filed in the sweep index later, by a purge).
pub const COMPLETE: &str = guarded!(
    "state = 'completed', outcome = ?5, response = ?6, response_expires_at = ?7, \
     key_expires_at = ?8, resource_id = COALESCE(?9, resource_id)"
);
/// Whether the record (`?1`–`?3`) is already completed under the token `?4`:
/// asked only when a completion changed no row, so that a retry after a lost
/// reply is not reported as a lost lease.
pub(crate) const COMPLETED_UNDER: &str = "
SELECT 1 FROM idem_records
WHERE owner = ?1 AND operation = ?2 AND key = ?3 AND token = ?4 AND state = 'completed'";
pub(crate) const RELEASE: &str = guarded!("state = 'released', lease_until = ?5");
pub(crate) const SAVE_RESOURCE_ID: &str = guarded!("resource_id = ?5");
/// Extending a lease keeps the key at least until the lease ends.
pub(crate) const EXTEND: &str =
    guarded!("lease_until = ?5, sweep_at = ?5, key_expires_at = MAX(key_expires_at, ?5)");

/// A purge walks the sweep index up to `?1` (now), at most `?2` rows per
/// statement; in-flight records whose key lives on (a lease that ended: a
/// stuck record) are passed over. First the expired keys go.
pub const PURGE_KEYS: &str = "
DELETE FROM idem_records WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE sweep_at <= ?1 AND key_expires_at <= ?1 AND (state <> 'in_flight' OR lease_until <= ?1)
    ORDER BY sweep_at LIMIT ?2)";
/// Then expired bodies are dropped, and their records re-filed at the key's
/// expiry.
pub const PURGE_BODIES: &str = "
UPDATE idem_records SET response = NULL, sweep_at = key_expires_at WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE sweep_at <= ?1 AND state <> 'in_flight' AND key_expires_at > ?1
      AND response IS NOT NULL AND response_expires_at <= ?1
    ORDER BY sweep_at LIMIT ?2)";
/// Then every other record the walk passes is re-filed at the time it next
/// has something to do: its body's expiry, else its key's. A record whose
/// body has expired is left to [`PURGE_BODIES`].
pub const REFILE: &str = "
UPDATE idem_records SET sweep_at = CASE
        WHEN response IS NOT NULL THEN MIN(response_expires_at, key_expires_at)
        ELSE key_expires_at END
WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE sweep_at <= ?1 AND state <> 'in_flight' AND key_expires_at > ?1
      AND (response IS NULL OR response_expires_at > ?1)
    ORDER BY sweep_at LIMIT ?2)";

/// The operator listing of in-flight records (`?1` lease bound, `?2` now,
/// `?3` limit), first page; walks the sweep index (an in-flight record's
/// `sweep_at` is its lease end, so the index order is the lease order). It
/// also passes the records completed since the last purge, which it filters
/// out.
pub const LIST_IN_FLIGHT: &str = "
SELECT owner, operation, key, state, attempt, lease_until, resource_id, key_expires_at
FROM idem_records
WHERE sweep_at <= ?1 AND state = 'in_flight' AND lease_until <= ?1 AND key_expires_at > ?2
ORDER BY sweep_at, owner, operation, key
LIMIT ?3";

/// The next pages: after the keyset position `(?4, ?5, ?6, ?7)`.
pub const LIST_IN_FLIGHT_AFTER: &str = "
SELECT owner, operation, key, state, attempt, lease_until, resource_id, key_expires_at
FROM idem_records
WHERE sweep_at <= ?1 AND state = 'in_flight' AND lease_until <= ?1 AND key_expires_at > ?2
  AND (sweep_at, owner, operation, key) > (?4, ?5, ?6, ?7)
ORDER BY sweep_at, owner, operation, key
LIMIT ?3";

/// The operator release (`?1`–`?3` the record, `?4` now, `?5` the attempt or
/// NULL): the lease ends now; token, resource id and attempt stay.
pub(crate) const RELEASE_IN_FLIGHT: &str = "
UPDATE idem_records SET lease_until = MIN(lease_until, ?4), sweep_at = MIN(lease_until, ?4)
WHERE owner = ?1 AND operation = ?2 AND key = ?3 AND state = 'in_flight'
  AND key_expires_at > ?4 AND (?5 IS NULL OR attempt = ?5)";

/// The operator delete (`?1`–`?3` the record, `?4` now): completed or
/// expired records only.
pub(crate) const DELETE_COMPLETED: &str = "
DELETE FROM idem_records
WHERE owner = ?1 AND operation = ?2 AND key = ?3
  AND (state = 'completed' OR key_expires_at <= ?4)";

/// Counts by state at `?1` (a full scan).
pub(crate) const COUNT_STATES: &str = "
SELECT
  COALESCE(SUM(key_expires_at > ?1 AND state = 'in_flight'), 0) AS in_flight,
  COALESCE(SUM(key_expires_at > ?1 AND state = 'in_flight' AND lease_until <= ?1), 0) AS stuck,
  COALESCE(SUM(key_expires_at > ?1 AND state = 'released'), 0) AS released,
  COALESCE(SUM(key_expires_at > ?1 AND state = 'completed'), 0) AS completed,
  COALESCE(SUM(key_expires_at <= ?1), 0) AS expired
FROM idem_records";
