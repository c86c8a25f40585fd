//! The operator API ([`AdminStore`]) of [`MySqlStore`]: indexed listing with
//! keyset pagination, release, delete and counts, one statement each.

use idem_core::clock::Timestamp;
use idem_core::ops::{Cursor, Page, RecordState, RecordSummary, StateCounts};
use idem_core::store::{AdminStore, InFlightQuery, StoreError};
use idem_core::{IdempotencyKey, RecordId, Scope};
use sqlx::Row;
use sqlx::mysql::MySqlRow;

use crate::error::{Error, store_error};
use crate::sql::q;
use crate::store::{MySqlStore, attempt_of, truncate};

/// A VARBINARY identity column as text (what was stored was text).
fn text(row: &MySqlRow, col: &str) -> Result<String, Error> {
    let bytes: Vec<u8> = row.try_get(col)?;
    String::from_utf8(bytes).map_err(|_| Error::Corrupt {
        detail: format!("stored {col} is not UTF-8"),
    })
}

fn decode_summary(row: &MySqlRow) -> Result<RecordSummary, Error> {
    let corrupt = |detail: String| Error::Corrupt { detail };
    let scope = Scope::new(text(row, "owner")?, text(row, "operation")?)
        .map_err(|e| corrupt(format!("stored scope: {e}")))?;
    let key = IdempotencyKey::parse(&text(row, "key")?)
        .map_err(|e| corrupt(format!("stored key: {e}")))?;
    let state: String = row.try_get("state")?;
    Ok(RecordSummary {
        id: RecordId::new(scope, key),
        state: RecordState::parse(&state)
            .ok_or_else(|| corrupt(format!("unknown state {:?}", truncate(&state))))?,
        attempt: attempt_of(row)?,
        lease_until: Timestamp::from_unix_millis(row.try_get("lease_until")?),
        resource_id: row.try_get("resource_id")?,
        key_expires_at: Timestamp::from_unix_millis(row.try_get("key_expires_at")?),
    })
}

/// Indexed listing with keyset pagination (the `sweep_idx` index, where an
/// in-flight record sits at its lease end); release, delete and counts are
/// one statement each. Counting scans the table.
impl AdminStore for MySqlStore {
    async fn list_in_flight(&self, qr: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        let limit = qr.limit.max(1);
        let after = qr.cursor.map(Cursor::keyset_position).transpose()?;
        let lease_before = qr.lease_before.as_unix_millis();
        let query = match &after {
            None => q(&self.sql().list_in_flight),
            Some(_) => q(&self.sql().list_in_flight_after),
        }
        .bind(lease_before)
        .bind(lease_before)
        .bind(qr.now.as_unix_millis());
        let query = match after {
            None => query,
            Some(a) => query
                .bind(a.lease_until.as_unix_millis())
                .bind(a.owner)
                .bind(a.operation)
                .bind(a.key),
        };
        let query = query.bind(i64::from(limit) + 1);
        let rows = on_conn!(self, |conn| async {
            query.fetch_all(conn).await.map_err(store_error)
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
        let attempt = attempt.map(|a| i32::try_from(a).unwrap_or(i32::MAX));
        let now = now.as_unix_millis();
        let query = q(&self.sql().release_in_flight)
            .bind(now)
            .bind(now)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(now)
            .bind(attempt)
            .bind(attempt);
        let done = on_conn!(self, |conn| async {
            query.execute(conn).await.map_err(store_error)
        })?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let query = q(&self.sql().delete_completed)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(now.as_unix_millis());
        let done = on_conn!(self, |conn| async {
            query.execute(conn).await.map_err(store_error)
        })?;
        Ok(done.rows_affected() == 1)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let now = now.as_unix_millis();
        let query = (0..6).fold(q(&self.sql().count_states), |q, _| q.bind(now));
        let row = on_conn!(self, |conn| async {
            query.fetch_one(conn).await.map_err(store_error)
        })?;
        let n = |col: &str| -> Result<u64, StoreError> {
            let v: i64 = row.try_get(col).map_err(store_error)?;
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
