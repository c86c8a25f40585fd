//! The SQL: where the records live ([`TableName`]) and every statement the
//! store runs ([`Statements`]), built once per table name. The claims below
//! are the part to read first.
//!
//! Placeholders are positional (`?`): each statement's comment lists its
//! bind order, which `store.rs` and `admin.rs` follow.

use std::sync::Arc;

use idem_sql::Param::{
    AfterKey, AfterLeaseUntil, Attempt, Body, Key, KeyExpiresAt, LeaseBefore, LeaseUntil, Limit,
    Now, Outcome, ResourceId, ResponseExpiresAt, Token,
};
use idem_sql::{SharedStatements, Statement};

/// Where the records live: a validated table name, in the connection's
/// database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    pub(crate) table: String,
}

impl TableName {
    /// `` `table` ``, safe to splice into SQL: the name was validated as a
    /// plain identifier, so the quoting cannot be escaped.
    pub(crate) fn quoted(&self) -> String {
        format!("`{}`", self.table)
    }
}

/// The SQL of every transition, built once per table name.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim_returning: Arc<str>,
    pub(crate) insert: Arc<str>,
    pub(crate) read: Arc<str>,
    pub(crate) takeover: Arc<str>,
    pub(crate) purge_delete: Arc<str>,
    pub(crate) purge_drop_bodies: Arc<str>,
    pub(crate) purge_refile: Arc<str>,
    /// The statements every dialect has, with their bind order.
    pub(crate) shared: SharedStatements,
    /// The table, quoted, for the statements built per batch size.
    table: String,
    /// The fresh claim's `INSERT INTO … (columns)`.
    insert_into: String,
}

/// The columns a record is decoded from (`store::decode_record`), plus its
/// token. The one `?` is `now`: the body only while it lives.
const RECORD_COLUMNS: &str = "token, owner, operation, `key`, fingerprint, state, attempt, lease_until, resource_id, outcome, \
     IF(response_expires_at > ?, response, NULL) AS response, response_expires_at, key_expires_at";

const SUMMARY_COLUMNS: &str =
    "owner, operation, `key`, state, attempt, lease_until, resource_id, key_expires_at";

/// The primary key: binds the record's key (`idem_sql::record_key`).
const PK: &str = "id = ?";

/// One fresh claim's values. Binds: the record's key, owner, operation,
/// key, fingerprint, token, lease_until, key_expires_at, lease_until,
/// lease_until (the sweep time). The key lives at least as long as the
/// lease.
const FRESH_ROW: &str = "(?, ?, ?, ?, ?, 'in_flight', ?, 1, ?, GREATEST(?, ?), ?)";

/// What a batch's claim returns per record: its key, and the columns of
/// [`RECORD_COLUMNS`] with the body whatever its expiry (the store drops an
/// expired one; a multi-row `RETURNING` has no per-row `now`).
const BATCH_COLUMNS: &str = "id, token, owner, operation, `key`, fingerprint, state, attempt, lease_until, resource_id, \
     outcome, response, response_expires_at, key_expires_at";

impl Statements {
    /// MariaDB's claim of a batch of `n` records: the fresh claim's insert
    /// with `n` rows ([`FRESH_ROW`] each, in the batch's key order), a
    /// no-op update on a duplicate, every row returned as it now stands
    /// ([`BATCH_COLUMNS`]). Built per batch size; sqlx prepares each text
    /// once per connection.
    pub(crate) fn claim_batch(&self, n: usize) -> Arc<str> {
        let rows = vec![FRESH_ROW; n].join(", ");
        format!(
            "{} VALUES {rows} ON DUPLICATE KEY UPDATE token = token RETURNING {BATCH_COLUMNS}",
            self.insert_into
        )
        .into()
    }

    /// The completions of a batch of `n` records: one fenced update of the
    /// rows its keys name (`id IN (…)`, a range of the primary key), each
    /// column set per row by a `CASE` on the key (no derived table, so no
    /// temporary table per batch). Binds, each list in the batch's order:
    /// (key, outcome) per completion, (key, body), (key, response expiry),
    /// (key, key expiry), (key, resource id or NULL); then every key; then
    /// (key, token).
    pub(crate) fn complete_batch(&self, n: usize) -> Arc<str> {
        let case = " WHEN ? THEN ?".repeat(n);
        let keys = vec!["?"; n].join(", ");
        format!(
            "UPDATE {t} SET state = 'completed',
                 outcome = CASE id{case} END,
                 response = CASE id{case} END,
                 response_expires_at = CASE id{case} END,
                 key_expires_at = CASE id{case} END,
                 resource_id = COALESCE(CASE id{case} END, resource_id)
             WHERE id IN ({keys}) AND state = 'in_flight' AND token = CASE id{case} END",
            t = self.table
        )
        .into()
    }

    /// The completed records among `n` (binds: each record's key): their
    /// key and token, to tell a completion already applied from a lost
    /// lease after a batch changed fewer rows than it held.
    pub(crate) fn completed_batch(&self, n: usize) -> Arc<str> {
        let keys = vec!["?"; n].join(", ");
        format!(
            "SELECT id, token FROM {t} WHERE id IN ({keys}) AND state = 'completed'",
            t = self.table
        )
        .into()
    }
}

impl Statements {
    #[allow(clippy::too_many_lines)]
    pub(crate) fn new(name: &TableName) -> Self {
        let t = name.quoted();
        let cols = RECORD_COLUMNS;
        let summary = SUMMARY_COLUMNS;
        // Binds: the SET values, then the record's key and the token.
        let guarded = |set: &str| {
            format!("UPDATE {t} SET {set} WHERE {PK} AND token = ? AND state = 'in_flight'")
        };
        // The insert of a fresh claim. Binds: the record's key, owner,
        // operation, key, fingerprint, token, lease_until, key_expires_at,
        // lease_until, lease_until (the sweep time). The key lives at least
        // as long as the lease.
        let insert_into = format!(
            "INSERT INTO {t} (id, owner, operation, `key`, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at)"
        );
        let insert = format!("{insert_into}\n             VALUES {FRESH_ROW}");
        Self {
            // MariaDB's claim (10.5+: `INSERT … RETURNING`): the insert
            // above, and on a duplicate key a no-op update (`token = token`
            // is the standing row's own token), returning the row as it now
            // stands. Binds: the insert's ten, then now. One statement, one
            // round trip:
            //
            // * absent → inserted, and the row returned carries our token;
            // * present → returned unchanged (another token): the record to
            //   replay, refuse, or take over (`takeover`, a second statement
            //   on the rare path). The duplicate takes the row's exclusive
            //   lock for the statement (InnoDB locks what `ON DUPLICATE KEY`
            //   may update), so replays of one key queue for microseconds;
            //   in a transaction it waits for an uncommitted claim of the
            //   same key to end, which is the transactional mode's wait.
            claim_returning: format!("{insert} ON DUPLICATE KEY UPDATE token = token RETURNING {cols}")
                .into(),
            // MySQL's claim (no `RETURNING`): the plain insert; a duplicate
            // key (`ER_DUP_ENTRY`, a typed error, no `IGNORE` that would
            // also turn truncations into warnings) → `read`.
            insert: insert.clone().into(),
            // The read after a duplicate key on MySQL. Binds: now, the
            // record's key. No row: the record went between the two
            // statements (purged): a race lost, run again.
            read: format!("SELECT {cols} FROM {t} WHERE {PK}").into(),
            // The takeover of exactly the version the claim read: guarded by
            // every column the decision read (the token changes with every
            // claim; the holder's own writes change the state, the lease,
            // the key's expiry or the resource id), so the values computed
            // from it hold, and of two racing takeovers exactly one updates.
            // No row: a race lost. Binds: fingerprint, token, attempt,
            // lease_until, sweep_at, key_expires_at, resource_id; then
            // the record's key and the token, state, attempt,
            // lease_until, key_expires_at and resource_id read.
            takeover: format!(
                "UPDATE {t} SET fingerprint = ?, state = 'in_flight', token = ?, attempt = ?,
                    lease_until = ?, sweep_at = ?, key_expires_at = ?, resource_id = ?,
                    outcome = NULL, response = NULL, response_expires_at = NULL
                 WHERE {PK} AND token = ? AND state = ? AND attempt = ? AND lease_until = ?
                   AND key_expires_at = ? AND resource_id <=> ?"
            )
            .into(),
            // The purge: three statements per batch, each walking the sweep
            // index up to now (`sweep_at <= ?` first, `ORDER BY sweep_at
            // LIMIT ?`: a range of the index, at most the limit changed).
            // In-flight records whose key lives on are passed, not taken (an
            // in-flight record's `sweep_at` is its lease end).
            //
            // 1. expired keys are deleted (binds: now ×3, limit);
            purge_delete: format!(
                "DELETE FROM {t}
                 WHERE sweep_at <= ? AND key_expires_at <= ? AND (state <> 'in_flight' OR lease_until <= ?)
                 ORDER BY sweep_at LIMIT ?"
            )
            .into(),
            // 2. expired bodies of live keys are dropped, the record re-filed
            //    at its key's expiry (binds: now ×3, limit);
            purge_drop_bodies: format!(
                "UPDATE {t} SET response = NULL, sweep_at = key_expires_at
                 WHERE sweep_at <= ? AND state <> 'in_flight' AND key_expires_at > ?
                   AND response IS NOT NULL AND response_expires_at <= ?
                 ORDER BY sweep_at LIMIT ?"
            )
            .into(),
            // 3. every other record passed is re-filed at the time it next
            //    has something to do: its body's expiry, else its key's
            //    (binds: now ×3, limit). A completion never moves a record
            //    in the index; this does, once, in batches.
            purge_refile: format!(
                "UPDATE {t} SET sweep_at = IF(response IS NOT NULL AND response_expires_at > ?,
                                              LEAST(response_expires_at, key_expires_at), key_expires_at)
                 WHERE sweep_at <= ? AND state <> 'in_flight' AND key_expires_at > ?
                 ORDER BY sweep_at LIMIT ?"
            )
            .into(),
            shared: SharedStatements {
                // A completion changes no indexed column.
                complete: Statement::new(
                    guarded(
                        "state = 'completed', outcome = ?, response = ?, response_expires_at = ?, \
                         key_expires_at = ?, resource_id = COALESCE(?, resource_id)",
                    ),
                    &[Outcome, Body, ResponseExpiresAt, KeyExpiresAt, ResourceId, Key, Token],
                ),
                // Asked only when a completion matched no row: is the record
                // already completed under this token (a retry after a lost
                // reply, not a lost lease)?
                completed_under: Statement::new(
                    format!("SELECT 1 FROM {t} WHERE {PK} AND token = ? AND state = 'completed'"),
                    &[Key, Token],
                ),
                release: Statement::new(
                    guarded("state = 'released', lease_until = ?"),
                    &[Now, Key, Token],
                ),
                save_resource_id: Statement::new(
                    guarded("resource_id = ?"),
                    &[ResourceId, Key, Token],
                ),
                // The key is kept at least until the lease ends.
                extend_lease: Statement::new(
                    guarded(
                        "lease_until = ?, sweep_at = ?, key_expires_at = GREATEST(key_expires_at, ?)",
                    ),
                    &[LeaseUntil, LeaseUntil, LeaseUntil, Key, Token],
                ),
                fetch: Statement::new(
                    format!(
                        "SELECT {cols} FROM {t} WHERE {PK} \
                         AND (key_expires_at > ? OR (state = 'in_flight' AND lease_until > ?))"
                    ),
                    &[Now, Key, Now, Now],
                ),
                // The operator listing, walking the sweep index (an
                // in-flight record's `sweep_at` is its lease end, so the
                // index order is the lease order).
                list_in_flight: Statement::new(
                    format!(
                        "SELECT {summary} FROM {t}
                         WHERE sweep_at <= ? AND state = 'in_flight' AND lease_until <= ? AND key_expires_at > ?
                         ORDER BY sweep_at, id LIMIT ?"
                    ),
                    &[LeaseBefore, LeaseBefore, Now, Limit],
                ),
                list_in_flight_after: Statement::new(
                    format!(
                        "SELECT {summary} FROM {t}
                         WHERE sweep_at <= ? AND state = 'in_flight' AND lease_until <= ? AND key_expires_at > ?
                           AND (sweep_at, id) > (?, ?)
                         ORDER BY sweep_at, id LIMIT ?"
                    ),
                    &[
                        LeaseBefore,
                        LeaseBefore,
                        Now,
                        AfterLeaseUntil,
                        AfterKey,
                        Limit,
                    ],
                ),
                // The lease ends now; the token, resource id and attempt
                // stay.
                release_in_flight: Statement::new(
                    format!(
                        "UPDATE {t} SET lease_until = LEAST(lease_until, ?), sweep_at = LEAST(lease_until, ?)
                         WHERE {PK} AND state = 'in_flight' AND key_expires_at > ?
                           AND (? IS NULL OR attempt = ?)"
                    ),
                    &[Now, Now, Key, Now, Attempt, Attempt],
                ),
                delete_completed: Statement::new(
                    format!(
                        "DELETE FROM {t} WHERE {PK} AND (state = 'completed' OR key_expires_at <= ?)"
                    ),
                    &[Key, Now],
                ),
                count_states: Statement::new(
                    format!(
                        "SELECT
                           COUNT(CASE WHEN key_expires_at > ? AND state = 'in_flight' THEN 1 END) AS in_flight,
                           COUNT(CASE WHEN key_expires_at > ? AND state = 'in_flight' AND lease_until <= ? THEN 1 END) AS stuck,
                           COUNT(CASE WHEN key_expires_at > ? AND state = 'released' THEN 1 END) AS released,
                           COUNT(CASE WHEN key_expires_at > ? AND state = 'completed' THEN 1 END) AS completed,
                           COUNT(CASE WHEN key_expires_at <= ? THEN 1 END) AS expired
                         FROM {t}"
                    ),
                    &[Now, Now, Now, Now, Now, Now],
                ),
            },
            table: t,
            insert_into,
        }
    }
}

pub(crate) fn q(
    sql: &Arc<str>,
) -> sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    idem_sql::query(sql)
}
