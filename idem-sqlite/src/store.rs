//! `SqliteStore`: the `Store` contract on SQLite. The claim logic is here.

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, OutcomeKind, Previous,
    PurgeReport, RecordState, StoredRecord, TakeoverReason, Token, retry_claim_race,
};
use idem_core::{Fingerprint, RecordId, Store, StoreError, Timestamp};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqlitePool};

use crate::error::{corrupt, map};
use crate::schema;

/// An idempotency store in one SQLite table, `idem_records`.
///
/// Every transition is one statement: the claim is an
/// `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING` that SQLite runs under
/// its write lock, so two racing claims can never both win. A claim that loses
/// reads the standing record with a second statement; if that read finds the
/// record claimable after all (it changed in between), the claim runs again.
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

    /// Creates the table and its indexes if they do not exist (the shipped
    /// `migrations/0001_idem.sql`, in one transaction).
    ///
    /// # Errors
    ///
    /// The DDL fails.
    pub async fn migrate(&self) -> Result<(), crate::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::raw_sql(schema::MIGRATION).execute(&mut *tx).await?;
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

/// Whether `claim` would have taken this record (it changed under us).
fn claimable(r: &StoredRecord, req: &ClaimRequest<'_>) -> bool {
    r.takeover_reason(&req.fingerprint, req.now).is_some()
}

impl Store for SqliteStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let id = req.id;
        retry_claim_race(crate::error::BACKEND, || async {
            let won = sqlx::query(schema::CLAIM)
                .bind(id.owner())
                .bind(id.operation())
                .bind(id.key().as_str())
                .bind(req.fingerprint.as_bytes().as_slice())
                .bind(req.token.as_i64())
                .bind(ms(req.lease_until))
                .bind(ms(req.key_expires_at))
                .bind(ms(req.now))
                .fetch_optional(&self.pool)
                .await
                .map_err(map)?;
            if let Some(row) = won {
                return Ok(Some(ClaimOutcome::Claimed(decode_claimed(&row)?)));
            }
            match self.fetch(id, req.now).await? {
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
        self.guarded(schema::COMPLETE, id, token, |q| {
            q.bind(c.outcome.as_str())
                .bind(c.body)
                .bind(ms(c.response_expires_at))
                .bind(ms(c.key_expires_at))
                .bind(c.resource_id)
        })
        .await
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        self.guarded(schema::RELEASE, id, token, |q| q.bind(ms(now)))
            .await
    }

    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.guarded(schema::CHECKPOINT, id, token, |q| q.bind(resource_id))
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
        let row = sqlx::query(schema::FETCH)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(ms(now))
            .fetch_optional(&self.pool)
            .await
            .map_err(map)?;
        row.as_ref().map(decode_record).transpose()
    }

    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        let keys = sqlx::query(schema::PURGE_KEYS)
            .bind(ms(now))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(map)?;
        let bodies = sqlx::query(schema::PURGE_BODIES)
            .bind(ms(now))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(map)?;
        Ok(PurgeReport {
            keys_removed: keys.rows_affected(),
            bodies_dropped: bodies.rows_affected(),
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}
