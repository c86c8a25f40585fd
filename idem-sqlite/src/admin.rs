//! The operator API ([`AdminStore`]) of [`SqliteStore`]: indexed listing
//! with keyset pagination, release, delete and counts, one statement each.

use idem_core::clock::Timestamp;
use idem_core::ops::{Cursor, Page, RecordState, RecordSummary, StateCounts};
use idem_core::store::{AdminStore, InFlightQuery, StoreError};
use idem_core::{IdempotencyKey, RecordId, Scope};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::error::{corrupt, map};
use crate::sql::q;
use crate::store::SqliteStore;

fn ms(t: Timestamp) -> i64 {
    t.as_unix_millis()
}

/// Rebuilds a record's identity from its stored columns.
fn decode_id(owner: String, operation: String, key: &str) -> Result<RecordId, StoreError> {
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
    async fn list_in_flight(&self, qr: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        let limit = qr.limit.max(1);
        let after = qr.cursor.map(Cursor::keyset_position).transpose()?;
        let query = match &after {
            None => q(&self.sql().list_in_flight),
            Some(_) => q(&self.sql().list_in_flight_after),
        }
        .bind(ms(qr.lease_before))
        .bind(ms(qr.now))
        .bind(i64::from(limit) + 1);
        let query = match &after {
            None => query,
            Some(a) => query
                .bind(ms(a.lease_until))
                .bind(a.owner.as_str())
                .bind(a.operation.as_str())
                .bind(a.key.as_str()),
        };
        let rows = on_conn!(self, |conn| async {
            query.fetch_all(conn).await.map_err(map)
        })?;
        let records = rows
            .iter()
            .map(decode_summary)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page::keyset(records, limit))
    }

    async fn release_in_flight(
        &self,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let query = q(&self.sql().release_in_flight)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(ms(now))
            .bind(attempt.map(i64::from));
        let done = on_conn!(self, |conn| async {
            query.execute(conn).await.map_err(map)
        })?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let query = q(&self.sql().delete_completed)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(ms(now));
        let done = on_conn!(self, |conn| async {
            query.execute(conn).await.map_err(map)
        })?;
        Ok(done.rows_affected() == 1)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let query = q(&self.sql().count_states).bind(ms(now));
        let row = on_conn!(self, |conn| async {
            query.fetch_one(conn).await.map_err(map)
        })?;
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
