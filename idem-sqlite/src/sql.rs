//! The SQL: every statement the store runs ([`Statements`]), built once per
//! table name. The claim below is the part to read first.
//!
//! Times are Unix milliseconds from the engine's clock. `{t}` below is the
//! quoted table name; the name was validated as a plain identifier
//! (`config::validate_table_name`), so quoting cannot be escaped.

use std::sync::Arc;

use idem_sql::Param::{
    AfterKey, AfterLeaseUntil, Attempt, Body, Key, KeyExpiresAt, LeaseBefore, LeaseUntil, Limit,
    Now, Outcome, ResourceId, ResponseExpiresAt, Token,
};
use idem_sql::{SharedStatements, Statement};
use sqlx::sqlite::{Sqlite, SqliteArguments};

/// The SQL of every transition, built once per table name.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim: Arc<str>,
    pub(crate) purge_scan: Arc<str>,
    pub(crate) purge_keys: Arc<str>,
    pub(crate) purge_bodies: Arc<str>,
    /// The reads of a batch's claims as one statement, for 1, 2, 4, … 128
    /// claims ([`Statements::read_batch`]).
    read_batches: Vec<Arc<str>>,
    /// A batch's completions as one statement, for 1, 2, 4, … 128
    /// completions ([`Statements::complete_batch`]).
    complete_batches: Vec<Arc<str>>,
    /// The statements every dialect has, with their bind order.
    pub(crate) shared: SharedStatements,
    pub(crate) layout: Arc<str>,
}

/// The key of a record is expired and no lease holds it (an in-flight record
/// is never expired while `lease_until > now`); `?8` is the claim's `now`.
const EXPIRED: &str =
    "({t}.key_expires_at <= ?8 AND ({t}.state <> 'in_flight' OR {t}.lease_until <= ?8))";

/// [`idem_sql::keyed`] for this dialect's `?N` parameters.
fn keyed(sql: &str) -> Arc<str> {
    idem_sql::keyed(sql, '?')
}

impl Statements {
    /// The statements on the table `table` (a validated identifier).
    pub(crate) fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        let pk = "id = ?1";
        let expired = EXPIRED.replace("{t}", &t);
        // Every guarded write ends with this condition on `?1..?4`.
        let guarded = |set: &str| {
            format!("UPDATE {t} SET {set} WHERE {pk} AND token = ?4 AND state = 'in_flight'")
        };
        let summary =
            "owner, operation, key, state, attempt, lease_until, resource_id, key_expires_at";
        let in_flight = "state = 'in_flight' AND lease_until <= ?1 AND key_expires_at > ?2";
        // The reads of a batch's claims (`?1`, `?3`, … each record's key,
        // `?2`, `?4`, … its claim's now): `fetch` below for each pair at
        // once, its key column beside the record so that each row finds its
        // claim.
        let read_batches = batched(2, |rows| {
            format!(
                "WITH idem_batch(id, now) AS (VALUES {rows})
SELECT rec.id, rec.owner, rec.operation, rec.key, rec.fingerprint, rec.state, rec.attempt,
       rec.lease_until, rec.resource_id, rec.outcome,
       CASE WHEN rec.response_expires_at > idem_batch.now THEN rec.response END AS response,
       rec.response_expires_at, rec.key_expires_at
FROM idem_batch JOIN {t} AS rec ON rec.id = idem_batch.id
WHERE rec.key_expires_at > idem_batch.now
   OR (rec.state = 'in_flight' AND rec.lease_until > idem_batch.now)"
            )
        });
        // A batch's completions (per record: key, token, outcome, body,
        // response expiry, key expiry, resource id or NULL): the `complete`
        // below for each at once, one statement and so one commit; the keys
        // of the records it completed come back.
        let complete_batches = batched(7, |rows| {
            format!(
                "WITH idem_batch(id, token, outcome, response, response_expires_at, key_expires_at,
                resource_id) AS (VALUES {rows})
UPDATE {t} SET state = 'completed', outcome = idem_batch.outcome,
    response = idem_batch.response, response_expires_at = idem_batch.response_expires_at,
    key_expires_at = idem_batch.key_expires_at,
    resource_id = COALESCE(idem_batch.resource_id, {t}.resource_id)
FROM idem_batch
WHERE {t}.id = idem_batch.id AND {t}.token = idem_batch.token AND {t}.state = 'in_flight'
RETURNING id"
            )
        });
        Self {
            read_batches,
            complete_batches,
            // The claim (`?1` owner, `?2` operation, `?3` key, `?4`
            // fingerprint, `?5` token, `?6` lease end, `?7` key expiry, `?8`
            // now, `?9` the record's key): insert when absent; overwrite when the key expired (and
            // no lease holds); take over a released record or an expired
            // lease with the same fingerprint. The key is kept at least until
            // the new lease ends (`key_expires_at = MAX(key_expires_at,
            // lease_until)`). Returns a row only when the caller won.
            claim: format!(
                "INSERT INTO {t}
    (id, owner, operation, key, fingerprint, state, token, attempt, lease_until,
     takeover, resource_id, outcome, response, response_expires_at, key_expires_at)
VALUES (?9, ?1, ?2, ?3, ?4, 'in_flight', ?5, 1, ?6, NULL, NULL, NULL, NULL, NULL, MAX(?7, ?6))
ON CONFLICT (id) DO UPDATE SET
    owner = excluded.owner,
    operation = excluded.operation,
    key = excluded.key,
    takeover = CASE
        WHEN {expired} THEN NULL
        WHEN {t}.state = 'released' THEN 'released'
        ELSE 'lease_expired' END,
    attempt = CASE WHEN {expired} THEN 1 ELSE {t}.attempt + 1 END,
    resource_id = CASE WHEN {expired} THEN NULL ELSE {t}.resource_id END,
    key_expires_at = CASE WHEN {expired}
        THEN excluded.key_expires_at ELSE MAX({t}.key_expires_at, excluded.lease_until) END,
    fingerprint = excluded.fingerprint,
    state = 'in_flight',
    token = excluded.token,
    lease_until = excluded.lease_until,
    outcome = NULL,
    response = NULL,
    response_expires_at = NULL
WHERE {expired}
   OR ({t}.fingerprint = excluded.fingerprint
       AND {t}.owner = excluded.owner AND {t}.operation = excluded.operation
       AND {t}.key = excluded.key
       AND ({t}.state = 'released'
            OR ({t}.state = 'in_flight' AND {t}.lease_until <= ?8)))
RETURNING attempt, takeover, resource_id"
            )
            .into(),
            // A purge round reads the table in `rowid` order after `?1`,
            // outside the write lock (under WAL, a read waits for no
            // writer): the rows of at most `?3` records with something due
            // at `?2` (now), an expired key or an expired body.
            purge_scan: format!(
                "SELECT rowid FROM {t}
WHERE rowid > ?1
  AND ((key_expires_at <= ?2 AND (state <> 'in_flight' OR lease_until <= ?2))
    OR (state <> 'in_flight' AND response IS NOT NULL AND response_expires_at <= ?2))
ORDER BY rowid LIMIT ?3"
            )
            .into(),
            // Then, in one write transaction, the rows it found (`?1`, a JSON
            // array of rowids) that are still due at `?2`: first the expired
            // keys go (in-flight records whose key lives on, a lease that
            // ended, are passed over: the stuck list shows them) ...
            purge_keys: format!(
                "DELETE FROM {t}
WHERE rowid IN (SELECT value FROM json_each(?1))
  AND key_expires_at <= ?2 AND (state <> 'in_flight' OR lease_until <= ?2)"
            )
            .into(),
            // ... then the expired bodies of the records that stay.
            purge_bodies: format!(
                "UPDATE {t} SET response = NULL
WHERE rowid IN (SELECT value FROM json_each(?1))
  AND state <> 'in_flight' AND key_expires_at > ?2
  AND response IS NOT NULL AND response_expires_at <= ?2"
            )
            .into(),
            shared: SharedStatements {
                // The completion: `?1`–`?4` the record and token, `?5`
                // outcome, `?6` body, `?7` response expiry, `?8` key expiry,
                // `?9` resource id or NULL. It changes no indexed column, so
                // it rewrites the table's page and no index.
                complete: Statement::new(
                    keyed(&guarded(
                        "state = 'completed', outcome = ?5, response = ?6, response_expires_at = ?7, \
                         key_expires_at = ?8, resource_id = COALESCE(?9, resource_id)",
                    )),
                    &[Key, Token, Outcome, Body, ResponseExpiresAt, KeyExpiresAt, ResourceId],
                ),
                // Whether the record is already completed under the token
                // `?4`: asked only when a completion changed no row, so that
                // a retry after a lost reply is not reported as a lost lease.
                completed_under: Statement::new(
                    keyed(&format!(
                        "SELECT 1 FROM {t} WHERE {pk} AND token = ?4 AND state = 'completed'"
                    )),
                    &[Key, Token],
                ),
                release: Statement::new(
                    keyed(&guarded("state = 'released', lease_until = ?5")),
                    &[Key, Token, Now],
                ),
                save_resource_id: Statement::new(
                    keyed(&guarded("resource_id = ?5")),
                    &[Key, Token, ResourceId],
                ),
                // Extending a lease keeps the key at least until the lease
                // ends.
                extend_lease: Statement::new(
                    keyed(&guarded(
                        "lease_until = ?5, key_expires_at = MAX(key_expires_at, ?5)",
                    )),
                    &[Key, Token, LeaseUntil],
                ),
                // Reads a live record (`?1`–`?3` the record, `?4` now): its
                // key has not expired, or it is in flight under a lease; the
                // body only while `now < response_expires_at`.
                fetch: Statement::new(
                    keyed(&format!(
                        "SELECT owner, operation, key, fingerprint, state, attempt, lease_until, resource_id,
       outcome, CASE WHEN response_expires_at > ?4 THEN response END AS response,
       response_expires_at, key_expires_at
FROM {t}
WHERE {pk}
  AND (key_expires_at > ?4 OR (state = 'in_flight' AND lease_until > ?4))"
                    )),
                    &[Key, Now],
                ),
                // The operator listing of in-flight records (`?1` lease
                // bound, `?2` now, `?3` limit), first page, in lease order: a
                // read of the whole table and a sort of what it keeps (no
                // index serves it; see `migrations/0001_idem.sql`).
                list_in_flight: Statement::new(
                    format!(
                        "SELECT {summary} FROM {t}
WHERE {in_flight}
ORDER BY lease_until, id
LIMIT ?3"
                    ),
                    &[LeaseBefore, Now, Limit],
                ),
                // The next pages: after the keyset position `(?4, ?5)`
                // (lease end, record key).
                list_in_flight_after: Statement::new(
                    format!(
                        "SELECT {summary} FROM {t}
WHERE {in_flight}
  AND (lease_until, id) > (?4, ?5)
ORDER BY lease_until, id
LIMIT ?3"
                    ),
                    &[LeaseBefore, Now, Limit, AfterLeaseUntil, AfterKey],
                ),
                // The operator release (`?1`–`?3` the record, `?4` now, `?5`
                // the attempt or NULL): the lease ends now; token, resource
                // id and attempt stay.
                release_in_flight: Statement::new(
                    keyed(&format!(
                        "UPDATE {t} SET lease_until = MIN(lease_until, ?4)
WHERE {pk} AND state = 'in_flight'
  AND key_expires_at > ?4 AND (?5 IS NULL OR attempt = ?5)"
                    )),
                    &[Key, Now, Attempt],
                ),
                // The operator delete (`?1`–`?3` the record, `?4` now):
                // completed or expired records only.
                delete_completed: Statement::new(
                    keyed(&format!(
                        "DELETE FROM {t} WHERE {pk} AND (state = 'completed' OR key_expires_at <= ?4)"
                    )),
                    &[Key, Now],
                ),
                // Counts by state at `?1` (a full scan).
                count_states: Statement::new(
                    format!(
                        "SELECT
  COALESCE(SUM(key_expires_at > ?1 AND state = 'in_flight'), 0) AS in_flight,
  COALESCE(SUM(key_expires_at > ?1 AND state = 'in_flight' AND lease_until <= ?1), 0) AS stuck,
  COALESCE(SUM(key_expires_at > ?1 AND state = 'released'), 0) AS released,
  COALESCE(SUM(key_expires_at > ?1 AND state = 'completed'), 0) AS completed,
  COALESCE(SUM(key_expires_at <= ?1), 0) AS expired
FROM {t}"
                    ),
                    &[Now],
                ),
            },
            // The text that created the table (its layout's mark is in it),
            // if the table exists. The name is a validated identifier, so it
            // is safe in a literal.
            layout: format!(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = '{table}'"
            )
            .into(),
        }
    }
}

/// A query on one of the [`Statements`].
pub(crate) fn q(sql: &Arc<str>) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
    idem_sql::query(sql)
}

/// A statement for 1, 2, 4, … [`MAX_BATCH`](idem_sql::MAX_BATCH) rows of
/// `width` parameters each: `make` given the rows' `VALUES` list (`(?1, ?2),
/// (?3, ?4)` for width 2).
fn batched(width: usize, make: impl Fn(String) -> String) -> Vec<Arc<str>> {
    (0..=idem_sql::MAX_BATCH.trailing_zeros())
        .map(|k| {
            let rows: Vec<String> = (0..1usize << k)
                .map(|i| {
                    let params: Vec<String> =
                        (1..=width).map(|p| format!("?{}", i * width + p)).collect();
                    format!("({})", params.join(", "))
                })
                .collect();
            make(rows.join(", ")).into()
        })
        .collect()
}

/// Of `statements` (from [`batched`]), the one for `n` rows rounded up to a
/// power of two (a few texts, each prepared once per connection), and that
/// size; the caller binds the last row again up to it. `None` over
/// [`MAX_BATCH`](idem_sql::MAX_BATCH).
fn pick(statements: &[Arc<str>], n: usize) -> Option<(&Arc<str>, usize)> {
    let size = n.max(1).next_power_of_two();
    let at = usize::try_from(size.trailing_zeros()).ok()?;
    statements.get(at).map(|sql| (sql, size))
}

/// Which of `n` items each of a picked statement's `size` rows binds: each
/// in turn, then the last one again up to the size (a row read or updated
/// twice lands on the same item, with the same values).
pub(crate) fn bound_rows(n: usize, size: usize) -> impl Iterator<Item = usize> {
    (0..size).map(move |row| row.min(n.saturating_sub(1)))
}

impl Statements {
    /// The statement reading `n` claims' records at once, and how many
    /// (key, now) pairs it binds.
    pub(crate) fn read_batch(&self, n: usize) -> Option<(&Arc<str>, usize)> {
        pick(&self.read_batches, n)
    }

    /// The statement storing `n` completions at once, and how many rows it
    /// binds.
    pub(crate) fn complete_batch(&self, n: usize) -> Option<(&Arc<str>, usize)> {
        pick(&self.complete_batches, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_names_the_table_and_no_other() {
        let s = Statements::new("t_1");
        let own = [&s.claim, &s.purge_scan, &s.purge_keys, &s.purge_bodies];
        let shared = s.shared.all().map(|(_, statement)| statement.sql());
        for sql in own.into_iter().chain(shared) {
            assert!(sql.contains("\"t_1\""), "{sql}");
            assert!(!sql.contains("idem_records"), "{sql}");
            assert!(!sql.contains('{'), "{sql}");
        }
        assert!(s.layout.contains("name = 't_1'"));
    }

    /// A batch's read binds one (key, now) pair per claim, rounded up to a
    /// power of two, each row filtered by its own claim's now; more than
    /// one batch takes has no statement (the caller reads one by one).
    #[test]
    fn a_batch_read_binds_each_claims_key_and_now() {
        let s = Statements::new("t_1");
        for (n, size) in [(1, 1), (2, 2), (3, 4), (5, 8), (100, 128), (128, 128)] {
            let (sql, got) = s.read_batch(n).expect("a statement");
            assert_eq!(got, size, "{n} claims");
            assert!(
                sql.contains(&format!("(?{}, ?{})", 2 * size - 1, 2 * size)),
                "{sql}"
            );
            assert!(!sql.contains(&format!("?{}", 2 * size + 1)), "{sql}");
            assert!(sql.contains("JOIN \"t_1\" AS rec"), "{sql}");
            assert!(sql.contains("rec.key_expires_at > idem_batch.now"), "{sql}");
        }
        assert!(s.read_batch(129).is_none(), "over the batch: no statement");
        let (sql, size) = s.complete_batch(3).expect("a statement");
        assert_eq!(size, 4);
        assert!(sql.contains("(?22, ?23, ?24, ?25, ?26, ?27, ?28)"), "{sql}");
        assert!(!sql.contains("?29"), "{sql}");
        assert!(sql.contains("UPDATE \"t_1\" SET"), "{sql}");
    }
}
