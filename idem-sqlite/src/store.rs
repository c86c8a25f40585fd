//! `SqliteStore`: the `Store` contract on SQLite. The claim logic is here.

use idem_core::IdempotencyKey;
use idem_core::RecordId;
use idem_core::Scope;
use idem_core::TakeoverReason;
use idem_core::adapter::Fingerprint;
use idem_core::clock::Timestamp;
use idem_core::ops::Cursor;
use idem_core::ops::OutcomeKind;
use idem_core::ops::Page;
use idem_core::ops::PurgeReport;
use idem_core::ops::RecordState;
use idem_core::ops::RecordSummary;
use idem_core::ops::StateCounts;
use idem_core::store::AdminStore;
use idem_core::store::Capabilities;
use idem_core::store::ClaimOutcome;
use idem_core::store::ClaimRequest;
use idem_core::store::Claimed;
use idem_core::store::Completion;
use idem_core::store::InFlightQuery;
use idem_core::store::Previous;
use idem_core::store::Store;
use idem_core::store::StoreError;
use idem_core::store::StoredRecord;
use idem_core::store::Token;
use idem_core::store::retry_claim_race;
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{Row, SqlitePool};

use crate::error::{corrupt, map};
use crate::schema;

/// An idempotency store in one SQLite table, `idem_records`.
///
/// Every transition is one statement, except the claim: it first reads the
/// record (a replay or a conflict ends there, one read that takes no lock
/// under WAL); a key that is absent or claimable then runs an
/// `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING` that SQLite runs under
/// its write lock, so two racing claims can never both win. A completion
/// writes the table and no index (see `migrations/0002_sweep.sql`). A claim that loses
/// reads the standing record again; if that read finds the record claimable
/// after all (it changed in between), the claim runs again.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// A store over your pool. Run [`SqliteStore::migrate`] once (the
    /// `open*`/`memory` constructors do it for you).
    #[must_use]
    pub fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }

    /// The pool.
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Creates the table and its index, or brings a table made by an earlier
    /// version up to date: the shipped `migrations/0001_idem.sql` and
    /// `migrations/0002_sweep.sql`, each only when the table lacks it, in one
    /// `BEGIN IMMEDIATE` transaction. On an up-to-date table it is one read
    /// and takes no write lock (so it waits for no writer, and a read-only
    /// file opens).
    ///
    /// # Errors
    ///
    /// The DDL fails.
    pub async fn migrate(&self) -> Result<(), crate::Error> {
        let mut conn = self.pool.acquire().await?;
        if has_sweep(&mut conn).await? {
            return Ok(());
        }
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        // Asked again under the write lock: another process may have
        // migrated in between.
        if !has_sweep(&mut tx).await? {
            sqlx::raw_sql(schema::MIGRATION_0001)
                .execute(&mut *tx)
                .await?;
            sqlx::raw_sql(schema::MIGRATION_0002)
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx.commit().await?)
    }

    async fn guarded(
        &self,
        sql: &'static str,
        id: &RecordId,
        token: Token,
        bind: impl FnOnce(
            sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
        )
            -> sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(sql)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(token.as_i64());
        let done = bind(q).execute(&self.pool).await.map_err(map)?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::LeaseLost)
        }
    }
}

fn ms(t: Timestamp) -> i64 {
    t.as_unix_millis()
}

fn decode_claimed(row: &SqliteRow) -> Result<Claimed, StoreError> {
    let attempt: i64 = row.try_get("attempt").map_err(map)?;
    let attempt =
        u32::try_from(attempt).map_err(|_| corrupt(format!("attempt {attempt} out of range")))?;
    let takeover: Option<String> = row.try_get("takeover").map_err(map)?;
    let reason = takeover
        .map(|t| {
            TakeoverReason::parse(&t).ok_or_else(|| corrupt(format!("unknown takeover {t:?}")))
        })
        .transpose()?;
    let resource_id: Option<String> = row.try_get("resource_id").map_err(map)?;
    Ok(Claimed {
        attempt,
        previous: reason.map(|reason| Previous {
            reason,
            resource_id,
        }),
    })
}

/// Decodes a row of [`schema::FETCH`], refusing anything malformed.
fn decode_record(row: &SqliteRow) -> Result<StoredRecord, StoreError> {
    let fp: Vec<u8> = row.try_get("fingerprint").map_err(map)?;
    let fingerprint = Fingerprint::from_slice(&fp)
        .map_err(|len| corrupt(format!("fingerprint is {len} bytes, not 32")))?;
    let state: String = row.try_get("state").map_err(map)?;
    let state =
        RecordState::parse(&state).ok_or_else(|| corrupt(format!("unknown state {state:?}")))?;
    let attempt: i64 = row.try_get("attempt").map_err(map)?;
    let outcome: Option<String> = row.try_get("outcome").map_err(map)?;
    let outcome = outcome
        .map(|o| OutcomeKind::parse(&o).ok_or_else(|| corrupt(format!("unknown outcome {o:?}"))))
        .transpose()?;
    let response_expires_at: Option<i64> = row.try_get("response_expires_at").map_err(map)?;
    StoredRecord {
        fingerprint,
        state,
        attempt: u32::try_from(attempt)
            .map_err(|_| corrupt(format!("attempt {attempt} out of range")))?,
        lease_until: Timestamp::from_unix_millis(row.try_get("lease_until").map_err(map)?),
        resource_id: row.try_get("resource_id").map_err(map)?,
        outcome,
        response: row.try_get("response").map_err(map)?,
        response_expires_at: response_expires_at.map(Timestamp::from_unix_millis),
        key_expires_at: Timestamp::from_unix_millis(row.try_get("key_expires_at").map_err(map)?),
    }
    .validate(crate::error::BACKEND)
}

/// Reads a live record on `conn` ([`schema::FETCH`]).
async fn fetch_on(
    conn: &mut SqliteConnection,
    id: &RecordId,
    now: Timestamp,
) -> Result<Option<StoredRecord>, StoreError> {
    let row = sqlx::query(schema::FETCH)
        .bind(id.owner())
        .bind(id.operation())
        .bind(id.key().as_str())
        .bind(ms(now))
        .fetch_optional(&mut *conn)
        .await
        .map_err(map)?;
    row.as_ref().map(decode_record).transpose()
}

/// Whether `claim` would have taken this record (it changed under us).
fn claimable(r: &StoredRecord, req: &ClaimRequest<'_>) -> bool {
    r.takeover_reason(&req.fingerprint, req.now).is_some()
}

impl Store for SqliteStore {
    /// Read first, on one connection: a record that exists and may not be
    /// claimed (a replay, a conflict, a mismatch) is answered by that read
    /// alone, which under WAL takes no lock and waits for no writer. Only a
    /// key that is absent or claimable runs the claim (a write, under
    /// SQLite's single write lock); when that claim loses (a concurrent
    /// writer got there first), the record is read again.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let id = req.id;
        retry_claim_race(crate::error::BACKEND, || async {
            let mut conn = self.pool.acquire().await.map_err(map)?;
            match fetch_on(&mut conn, id, req.now).await? {
                Some(r) if !claimable(&r, req) => return Ok(Some(ClaimOutcome::Existing(r))),
                _ => {}
            }
            let won = sqlx::query(schema::CLAIM)
                .bind(id.owner())
                .bind(id.operation())
                .bind(id.key().as_str())
                .bind(req.fingerprint.as_bytes().as_slice())
                .bind(req.token.as_i64())
                .bind(ms(req.lease_until))
                .bind(ms(req.key_expires_at))
                .bind(ms(req.now))
                .fetch_optional(&mut *conn)
                .await
                .map_err(map)?;
            if let Some(row) = won {
                return Ok(Some(ClaimOutcome::Claimed(decode_claimed(&row)?)));
            }
            match fetch_on(&mut conn, id, req.now).await? {
                Some(r) if !claimable(&r, req) => Ok(Some(ClaimOutcome::Existing(r))),
                // Gone or claimable since the insert ran: claim again.
                _ => {
                    tracing::debug!("claim raced with another write; retrying");
                    Ok(None)
                }
            }
        })
        .await
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let done = self
            .guarded(schema::COMPLETE, id, token, |q| {
                q.bind(c.outcome.as_str())
                    .bind(c.body)
                    .bind(ms(c.response_expires_at))
                    .bind(ms(c.key_expires_at))
                    .bind(c.resource_id)
            })
            .await;
        if !matches!(done, Err(StoreError::LeaseLost)) {
            return done;
        }
        // No row changed: a lost lease, or this completion already applied
        // (a retry after a lost reply), which is not an error.
        let applied = sqlx::query(schema::COMPLETED_UNDER)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(token.as_i64())
            .fetch_optional(&self.pool)
            .await
            .map_err(map)?;
        if applied.is_some() { Ok(()) } else { done }
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        self.guarded(schema::RELEASE, id, token, |q| q.bind(ms(now)))
            .await
    }

    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.guarded(schema::SAVE_RESOURCE_ID, id, token, |q| q.bind(resource_id))
            .await
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        self.guarded(schema::EXTEND, id, token, |q| q.bind(ms(lease_until)))
            .await
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(map)?;
        fetch_on(&mut conn, id, now).await
    }

    /// One batch of each purge statement, in one transaction; batches that
    /// only re-filed records run again, so an empty report means nothing
    /// is left to purge.
    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(map)?;
        loop {
            let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE")
                .await
                .map_err(map)?;
            let mut run = async |sql: &'static str| {
                sqlx::query(sql)
                    .bind(ms(now))
                    .bind(i64::from(limit))
                    .execute(&mut *tx)
                    .await
                    .map(|done| done.rows_affected())
                    .map_err(map)
            };
            let report = PurgeReport {
                keys_removed: run(schema::PURGE_KEYS).await?,
                bodies_dropped: run(schema::PURGE_BODIES).await?,
            };
            let refiled = run(schema::REFILE).await?;
            tx.commit().await.map_err(map)?;
            if report != PurgeReport::default() || refiled == 0 {
                return Ok(report);
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

/// Whether the table exists and has had `0002_sweep.sql`.
async fn has_sweep(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(schema::HAS_SWEEP).fetch_one(conn).await
}

/// Rebuilds a record's identity from its stored columns.
pub(crate) fn decode_id(
    owner: String,
    operation: String,
    key: &str,
) -> Result<RecordId, StoreError> {
    let scope = Scope::new(owner, operation).map_err(|e| corrupt(format!("stored scope: {e}")))?;
    let key = IdempotencyKey::parse(key).map_err(|e| corrupt(format!("stored key: {e}")))?;
    Ok(RecordId::new(scope, key))
}

fn decode_summary(row: &SqliteRow) -> Result<RecordSummary, StoreError> {
    let id = decode_id(
        row.try_get("owner").map_err(map)?,
        row.try_get("operation").map_err(map)?,
        row.try_get("key").map_err(map)?,
    )?;
    let state: String = row.try_get("state").map_err(map)?;
    let attempt: i64 = row.try_get("attempt").map_err(map)?;
    Ok(RecordSummary {
        id,
        state: RecordState::parse(&state)
            .ok_or_else(|| corrupt(format!("unknown state {state:?}")))?,
        attempt: u32::try_from(attempt)
            .map_err(|_| corrupt(format!("attempt {attempt} out of range")))?,
        lease_until: Timestamp::from_unix_millis(row.try_get("lease_until").map_err(map)?),
        resource_id: row.try_get("resource_id").map_err(map)?,
        key_expires_at: Timestamp::from_unix_millis(row.try_get("key_expires_at").map_err(map)?),
    })
}

/// Indexed listing, keyset pagination; release, delete and counts are one
/// statement each.
impl AdminStore for SqliteStore {
    async fn list_in_flight(&self, q: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        let limit = q.limit.max(1);
        let after = q.cursor.map(Cursor::keyset_position).transpose()?;
        let query = match &after {
            None => sqlx::query(schema::LIST_IN_FLIGHT),
            Some(_) => sqlx::query(schema::LIST_IN_FLIGHT_AFTER),
        }
        .bind(ms(q.lease_before))
        .bind(ms(q.now))
        .bind(i64::from(limit) + 1);
        let query = match &after {
            None => query,
            Some(a) => query
                .bind(ms(a.lease_until))
                .bind(a.owner.as_str())
                .bind(a.operation.as_str())
                .bind(a.key.as_str()),
        };
        let rows = query.fetch_all(&self.pool).await.map_err(map)?;
        let mut records = rows
            .iter()
            .map(decode_summary)
            .collect::<Result<Vec<_>, _>>()?;
        let next = (records.len() > limit as usize).then(|| {
            records.truncate(limit as usize);
            let last = &records[records.len() - 1];
            Cursor::keyset(last.lease_until, &last.id)
        });
        Ok(Page { records, next })
    }

    async fn release_in_flight(
        &self,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(schema::RELEASE_IN_FLIGHT)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(ms(now))
            .bind(attempt.map(i64::from))
            .execute(&self.pool)
            .await
            .map_err(map)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let done = sqlx::query(schema::DELETE_COMPLETED)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(ms(now))
            .execute(&self.pool)
            .await
            .map_err(map)?;
        Ok(done.rows_affected() == 1)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let row = sqlx::query(schema::COUNT_STATES)
            .bind(ms(now))
            .fetch_one(&self.pool)
            .await
            .map_err(map)?;
        let n = |col: &str| -> Result<u64, StoreError> {
            let v: i64 = row.try_get(col).map_err(map)?;
            Ok(u64::try_from(v).unwrap_or(0))
        };
        Ok(StateCounts {
            in_flight: n("in_flight")?,
            stuck: n("stuck")?,
            released: n("released")?,
            completed: n("completed")?,
            expired: n("expired")?,
        })
    }
}
