//! [`PgStore`]: the [`Store`] implementation. Every transition is one SQL
//! statement; the claim below is the part to read first.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::Token;
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, OutcomeKind, Previous,
    PurgeReport, RecordState, StoredRecord, TakeoverReason, retry_claim_race,
};
use idem_core::{Fingerprint, RecordId, Store, StoreError, Timestamp};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgExecutor, PgPool, Row};
use tracing::debug;

use crate::config::TableName;
use crate::error::{BACKEND, Error, store_error};

/// The PostgreSQL idempotency store. Cheap to clone (a pool and two `Arc`s).
///
/// Build it with [`PgStore::new`] (your pool) or [`PgStore::connect`], pick
/// the table with [`PgStore::with_table_name`] /
/// [`PgStore::with_schema_name`], and create it with [`PgStore::migrate`].
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    name: Arc<TableName>,
    sql: Arc<Statements>,
    tx_lock_timeout: Duration,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.name.qualified())
            .field("pool_size", &self.pool.size())
            .field("tx_lock_timeout", &self.tx_lock_timeout)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    pub(crate) fn from_parts(
        pool: PgPool,
        name: Arc<TableName>,
        sql: Arc<Statements>,
        tx_lock_timeout: Duration,
    ) -> Self {
        Self {
            pool,
            name,
            sql,
            tx_lock_timeout,
        }
    }

    /// The pool.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema holding the table.
    #[must_use]
    pub fn schema_name(&self) -> &str {
        &self.name.schema
    }

    /// The table holding the records.
    #[must_use]
    pub fn table_name(&self) -> &str {
        &self.name.table
    }

    pub(crate) fn name(&self) -> &TableName {
        &self.name
    }

    pub(crate) fn tx_lock_timeout(&self) -> Duration {
        self.tx_lock_timeout
    }

    /// The claim statement, as the store runs it (`$1` owner, `$2` operation,
    /// `$3` key, `$4` fingerprint, `$5` token, `$6` now, `$7` lease end,
    /// `$8` key expiry; all times in Unix ms), to review, `EXPLAIN` or run as
    /// a raw-driver baseline.
    #[must_use]
    pub fn claim_statement(&self) -> &str {
        &self.sql.claim
    }

    /// The completion statement, as the store runs it (`$1`–`$3` the record,
    /// `$4` token, `$5` outcome, `$6` body, `$7` response expiry, `$8` key
    /// expiry, `$9` resource id or NULL).
    #[must_use]
    pub fn complete_statement(&self) -> &str {
        &self.sql.complete
    }

    /// The purge statement (`$1` now in Unix ms, `$2` the batch limit), to
    /// review or `EXPLAIN`: each half walks its expiry index.
    #[must_use]
    pub fn purge_statement(&self) -> &str {
        &self.sql.purge
    }
}

/// The SQL of every transition, built once per table name.
#[derive(Debug)]
pub(crate) struct Statements {
    claim: Arc<str>,
    complete: Arc<str>,
    release: Arc<str>,
    checkpoint: Arc<str>,
    extend_lease: Arc<str>,
    fetch: Arc<str>,
    purge: Arc<str>,
}

/// The columns a record is decoded from, in the order of [`decode_record`].
const RECORD_COLUMNS: &str = "fingerprint, state, attempt, lease_until, resource_id, outcome, \
     CASE WHEN response_expires_at > $N THEN response END AS response, response_expires_at, key_expires_at";

impl Statements {
    pub(crate) fn new(name: &TableName) -> Self {
        let t = name.qualified();
        let pk = "owner = $1 AND operation = $2 AND key = $3";
        let guarded = |set: &str| {
            format!("UPDATE {t} SET {set} WHERE {pk} AND token = $4 AND state = 'in_flight'")
        };
        Self {
            // The claim, in one statement. Parameters: $1 owner, $2 operation,
            // $3 key, $4 fingerprint, $5 token, $6 now, $7 lease_until,
            // $8 key_expires_at.
            //
            // * `cur` reads the record as of the statement's snapshot and says
            //   whether this request may claim it (key expired; or same
            //   fingerprint and released or lease ended).
            // * absent → `ins` inserts it. `ON CONFLICT DO NOTHING` covers a
            //   concurrent first claim: the insert waits on the unique index
            //   until the other transaction ends; if it committed, nothing is
            //   inserted.
            // * claimable → `upd` takes it over. Postgres re-checks the WHERE
            //   on the newest row version if a concurrent writer changed it,
            //   so of two racing takeovers exactly one updates.
            // * neither → the standing record is returned unchanged: a pure
            //   read, no row lock, no write (a replay costs one read).
            //
            // When a race was lost (absent in the snapshot but inserted by
            // another claimer; claimable in the snapshot but changed since)
            // the statement returns no row: the snapshot is stale. The store
            // then runs it again with a fresh snapshot (see `claim`), which
            // sees the winner's committed record.
            claim: format!(
                "WITH cur AS (
                    SELECT {cols},
                           key_expires_at <= $6
                           OR (fingerprint = $4
                               AND (state = 'released' OR (state = 'in_flight' AND lease_until <= $6))) AS claimable
                    FROM {t} WHERE {pk}
                ),
                ins AS (
                    INSERT INTO {t} (owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at)
                    SELECT $1, $2, $3, $4, 'in_flight', $5, 1, $7, $8
                    WHERE NOT EXISTS (SELECT 1 FROM cur)
                    ON CONFLICT (owner, operation, key) DO NOTHING
                    RETURNING attempt
                ),
                upd AS (
                    UPDATE {t} AS r SET
                        fingerprint = $4,
                        state = 'in_flight',
                        token = $5,
                        lease_until = $7,
                        attempt = CASE WHEN r.key_expires_at <= $6 THEN 1 ELSE r.attempt + 1 END,
                        resource_id = CASE WHEN r.key_expires_at <= $6 THEN NULL ELSE r.resource_id END,
                        key_expires_at = CASE WHEN r.key_expires_at <= $6 THEN $8 ELSE r.key_expires_at END,
                        outcome = NULL,
                        response = NULL,
                        response_expires_at = NULL
                    FROM cur
                    WHERE r.owner = $1 AND r.operation = $2 AND r.key = $3 AND cur.claimable
                      AND (r.key_expires_at <= $6
                           OR (r.fingerprint = $4
                               AND (r.state = 'released' OR (r.state = 'in_flight' AND r.lease_until <= $6))))
                    RETURNING r.attempt, r.resource_id, cur.state AS previous_state
                )
                SELECT 'claimed' AS kind, NULL::bytea AS fingerprint, previous_state AS state, attempt,
                       NULL::bigint AS lease_until, resource_id, NULL::text AS outcome, NULL::bytea AS response,
                       NULL::bigint AS response_expires_at, NULL::bigint AS key_expires_at
                FROM upd
                UNION ALL
                SELECT 'claimed', NULL, NULL, attempt, NULL, NULL, NULL, NULL, NULL, NULL FROM ins
                UNION ALL
                SELECT 'existing', fingerprint, state, attempt, lease_until, resource_id, outcome, response,
                       response_expires_at, key_expires_at
                FROM cur WHERE NOT claimable",
                cols = RECORD_COLUMNS.replace("$N", "$6"),
            )
            .into(),
            complete: guarded(
                "state = 'completed', outcome = $5, response = $6, response_expires_at = $7, \
                 key_expires_at = $8, resource_id = COALESCE($9, resource_id)",
            )
            .into(),
            release: guarded("state = 'released', lease_until = $5").into(),
            checkpoint: guarded("resource_id = $5").into(),
            extend_lease: guarded("lease_until = $5").into(),
            fetch: format!(
                "SELECT {cols} FROM {t} WHERE {pk} AND key_expires_at > $4",
                cols = RECORD_COLUMNS.replace("$N", "$4")
            )
            .into(),
            // Both halves of a purge in one statement, each bounded by $2 and
            // each walking its own index (see the EXPLAIN test). Rows being
            // claimed right now are skipped, not waited for; the rows picked
            // are locked (`FOR UPDATE` re-checks the condition on the newest
            // version), so the outer statement reaches exactly those by
            // `ctid` (a Tid Scan): a backlog of millions of expired rows
            // still costs one batch per call. The two sets are
            // disjoint (bodies are dropped only from rows whose key lives on),
            // as one statement may not change a row twice.
            purge: format!(
                "WITH gone AS (
                    DELETE FROM {t}
                    WHERE ctid = ANY(ARRAY(
                        SELECT ctid FROM {t} WHERE key_expires_at <= $1
                        LIMIT $2 FOR UPDATE SKIP LOCKED))
                    RETURNING 1
                ),
                dropped AS (
                    UPDATE {t} SET response = NULL
                    WHERE ctid = ANY(ARRAY(
                        SELECT ctid FROM {t}
                        WHERE response_expires_at <= $1 AND response IS NOT NULL AND key_expires_at > $1
                        LIMIT $2 FOR UPDATE SKIP LOCKED))
                    RETURNING 1
                )
                SELECT (SELECT count(*) FROM gone) AS keys_removed, (SELECT count(*) FROM dropped) AS bodies_dropped"
            )
            .into(),
        }
    }
}

fn q(sql: &Arc<str>) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    // The text comes from `Statements::new`: fixed SQL around validated,
    // quoted identifiers. Values always go through bind parameters.
    sqlx::query(AssertSqlSafe(Arc::clone(sql)))
}

/// Reads a record from the row, refusing anything a record cannot hold.
fn decode_record(row: &PgRow) -> Result<StoredRecord, Error> {
    let corrupt = |detail: String| Error::Corrupt { detail };
    let fp: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint = Fingerprint::from_slice(&fp)
        .map_err(|len| corrupt(format!("fingerprint is {len} bytes, not 32")))?;
    let state: String = row.try_get("state")?;
    let state = RecordState::parse(&state)
        .ok_or_else(|| corrupt(format!("unknown state {:?}", truncate(&state))))?;
    let outcome = match row.try_get::<Option<String>, _>("outcome")? {
        None => None,
        Some(o) => Some(
            OutcomeKind::parse(&o)
                .ok_or_else(|| corrupt(format!("unknown outcome {:?}", truncate(&o))))?,
        ),
    };
    let attempt: i32 = row.try_get("attempt")?;
    let attempt =
        u32::try_from(attempt).map_err(|_| corrupt(format!("negative attempt {attempt}")))?;
    StoredRecord {
        fingerprint,
        state,
        attempt,
        lease_until: Timestamp::from_unix_millis(row.try_get("lease_until")?),
        resource_id: row.try_get("resource_id")?,
        outcome,
        response: row.try_get("response")?,
        response_expires_at: row
            .try_get::<Option<i64>, _>("response_expires_at")?
            .map(Timestamp::from_unix_millis),
        key_expires_at: Timestamp::from_unix_millis(row.try_get("key_expires_at")?),
    }
    .validate(BACKEND)
    .map_err(|e| match e {
        StoreError::Corrupt { detail, .. } => corrupt(detail),
        other => corrupt(other.to_string()),
    })
}

/// Enough of a corrupted value to recognise it in a log, not more.
fn truncate(s: &str) -> &str {
    s.char_indices().nth(32).map_or(s, |(i, _)| &s[..i])
}

fn decode_claim(row: &PgRow) -> Result<ClaimOutcome, Error> {
    let kind: String = row.try_get("kind")?;
    if kind == "existing" {
        return decode_record(row).map(ClaimOutcome::Existing);
    }
    let attempt: i32 = row.try_get("attempt")?;
    let attempt = u32::try_from(attempt).map_err(|_| Error::Corrupt {
        detail: format!("negative attempt {attempt}"),
    })?;
    // A fresh record (inserted, or an expired key overwritten) has attempt
    // 1; a takeover has attempt >= 2 and reports the previous state as of the
    // statement's snapshot. If a holder released its expired lease between
    // that snapshot and the takeover, the reason reads `LeaseExpired`: the
    // cautious answer (the work reconciles either way).
    let previous = if attempt <= 1 {
        None
    } else {
        let state: Option<String> = row.try_get("state")?;
        let reason = match state.as_deref() {
            Some("released") => TakeoverReason::Released,
            _ => TakeoverReason::LeaseExpired,
        };
        Some(Previous {
            reason,
            resource_id: row.try_get("resource_id")?,
        })
    };
    Ok(ClaimOutcome::Claimed(Claimed { attempt, previous }))
}

impl PgStore {
    /// Runs the claim statement once on `conn` (a pool or a transaction).
    /// `None`: it lost a race and must be run again (see [`Statements::new`]).
    pub(crate) async fn claim_once<'c>(
        &self,
        conn: impl PgExecutor<'c>,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, Error> {
        let row = q(&self.sql.claim)
            .bind(req.id.owner())
            .bind(req.id.operation())
            .bind(req.id.key().as_str())
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.token.as_i64())
            .bind(req.now.as_unix_millis())
            .bind(req.lease_until.as_unix_millis())
            .bind(req.key_expires_at.as_unix_millis())
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(decode_claim).transpose()
    }

    pub(crate) async fn complete_on<'c>(
        &self,
        conn: impl PgExecutor<'c>,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let done = q(&self.sql.complete)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(token.as_i64())
            .bind(c.outcome.as_str())
            .bind(c.body)
            .bind(c.response_expires_at.as_unix_millis())
            .bind(c.key_expires_at.as_unix_millis())
            .bind(c.resource_id)
            .execute(conn)
            .await
            .map_err(store_error)?;
        fenced(done.rows_affected())
    }

    pub(crate) async fn release_on<'c>(
        &self,
        conn: impl PgExecutor<'c>,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.guarded(
            conn,
            &self.sql.release,
            id,
            token,
            GuardedValue::Int(now.as_unix_millis()),
        )
        .await
    }

    async fn guarded<'c>(
        &self,
        conn: impl PgExecutor<'c>,
        sql: &Arc<str>,
        id: &RecordId,
        token: Token,
        value: GuardedValue<'_>,
    ) -> Result<(), StoreError> {
        let query = q(sql)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(token.as_i64());
        let query = match value {
            GuardedValue::Int(v) => query.bind(v),
            GuardedValue::Text(v) => query.bind(v),
        };
        fenced(
            query
                .execute(conn)
                .await
                .map_err(store_error)?
                .rows_affected(),
        )
    }
}

enum GuardedValue<'a> {
    Int(i64),
    Text(&'a str),
}

/// One row changed: the token held. None: the lease is lost (or the record
/// is gone, or no longer in flight).
fn fenced(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

impl Store for PgStore {
    /// One statement; run again (at most 8 times in all) only
    /// when it lost a race to a concurrent writer on the same record, which
    /// the next run, with a fresh snapshot, sees committed.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        retry_claim_race(BACKEND, || async {
            let outcome = self.claim_once(&self.pool, req).await?;
            if outcome.is_none() {
                debug!("claim lost a race; running it again with a fresh snapshot");
            }
            Ok(outcome)
        })
        .await
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<(), StoreError> {
        self.complete_on(&self.pool, id, token, completion).await
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        self.release_on(&self.pool, id, token, now).await
    }

    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.guarded(
            &self.pool,
            &self.sql.checkpoint,
            id,
            token,
            GuardedValue::Text(resource_id),
        )
        .await
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        let until = GuardedValue::Int(lease_until.as_unix_millis());
        self.guarded(&self.pool, &self.sql.extend_lease, id, token, until)
            .await
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let row = q(&self.sql.fetch)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(now.as_unix_millis())
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(row.as_ref().map(decode_record).transpose()?)
    }

    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        let row = q(&self.sql.purge)
            .bind(now.as_unix_millis())
            .bind(i64::from(limit))
            .fetch_one(&self.pool)
            .await
            .map_err(store_error)?;
        let count = |col: &str| -> Result<u64, StoreError> {
            let n: i64 = row.try_get(col).map_err(store_error)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        Ok(PurgeReport {
            keys_removed: count("keys_removed")?,
            bodies_dropped: count("bodies_dropped")?,
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}
