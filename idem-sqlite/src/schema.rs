//! The shipped migration and the statements, all fixed at compile time.

/// The DDL of `migrations/0001_idem.sql` (idempotent).
pub const MIGRATION: &str = include_str!("../migrations/0001_idem.sql");

/// The claim (`?1` owner, `?2` operation, `?3` key, `?4` fingerprint,
/// `?5` token, `?6` lease end, `?7` key expiry, `?8` now; times in Unix ms):
/// insert when absent; overwrite when the key expired (and no lease holds:
/// an in-flight record is never expired while `lease_until > now`); take
/// over a released record or an expired lease with the same fingerprint.
/// The key is kept at least until the new lease ends
/// (`key_expires_at = MAX(key_expires_at, lease_until)`). Returns a row only
/// when the caller won. `?8` is the engine's `now`.
pub const CLAIM: &str = "
INSERT INTO idem_records
    (owner, operation, key, fingerprint, state, token, attempt, lease_until,
     takeover, resource_id, outcome, response, response_expires_at, key_expires_at)
VALUES (?1, ?2, ?3, ?4, 'in_flight', ?5, 1, ?6, NULL, NULL, NULL, NULL, NULL, MAX(?7, ?6))
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
/// `?7` response expiry, `?8` key expiry, `?9` resource id or NULL.
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
    guarded!("lease_until = ?5, key_expires_at = MAX(key_expires_at, ?5)");

/// Bounded purges, each driven by its index.
pub(crate) const PURGE_KEYS: &str = "
DELETE FROM idem_records WHERE rowid IN (
    SELECT rowid FROM idem_records WHERE key_expires_at <= ?1
        AND (state <> 'in_flight' OR lease_until <= ?1) LIMIT ?2)";
pub(crate) const PURGE_BODIES: &str = "
UPDATE idem_records SET response = NULL WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE response IS NOT NULL AND response_expires_at <= ?1 LIMIT ?2)";

/// The operator listing of in-flight records (`?1` lease bound, `?2` now,
/// `?3` limit), first page; walks the `idem_records_in_flight` index.
pub(crate) const LIST_IN_FLIGHT: &str = "
SELECT owner, operation, key, state, attempt, lease_until, resource_id, key_expires_at
FROM idem_records
WHERE state = 'in_flight' AND lease_until <= ?1 AND key_expires_at > ?2
ORDER BY lease_until, owner, operation, key
LIMIT ?3";

/// The next pages: after the keyset position `(?4, ?5, ?6, ?7)`.
pub(crate) const LIST_IN_FLIGHT_AFTER: &str = "
SELECT owner, operation, key, state, attempt, lease_until, resource_id, key_expires_at
FROM idem_records
WHERE state = 'in_flight' AND lease_until <= ?1 AND key_expires_at > ?2
  AND (lease_until, owner, operation, key) > (?4, ?5, ?6, ?7)
ORDER BY lease_until, owner, operation, key
LIMIT ?3";

/// The operator release (`?1`–`?3` the record, `?4` now, `?5` the attempt or
/// NULL): the lease ends now; token, resource id and attempt stay.
pub(crate) const RELEASE_IN_FLIGHT: &str = "
UPDATE idem_records SET lease_until = MIN(lease_until, ?4)
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
