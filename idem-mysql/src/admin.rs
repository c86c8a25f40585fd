//! The operator API ([`AdminStore`]) of [`MySqlStore`]: indexed listing with
//! keyset pagination, release, delete and counts, one statement each.

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::{AdminStore, InFlightQuery, StoreError};
use idem_core::store::{Cursor, Page, RecordSummary, StateCounts};
use sqlx::Row;
use sqlx::mysql::MySqlRow;

use crate::error::{Error, store_error};
use crate::sql::q;
use crate::store::MySqlStore;

/// A VARBINARY identity column as text (what was stored was text).
fn text(row: &MySqlRow, col: &'static str) -> Result<String, idem_sql::RowError> {
    let bytes: Vec<u8> = row.try_get(col)?;
    String::from_utf8(bytes)
        .map_err(|_| idem_sql::RowError::Corrupt(format!("stored {col} is not UTF-8")))
}

fn decode_summary(row: &MySqlRow) -> Result<RecordSummary, Error> {
    Ok(idem_sql::decode_summary::<_, i32>(row, text)?)
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
        let rows = idem_sql::on_conn!(self, |conn| async {
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
        let done = idem_sql::on_conn!(self, |conn| async {
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
        let done = idem_sql::on_conn!(self, |conn| async {
            query.execute(conn).await.map_err(store_error)
        })?;
        Ok(done.rows_affected() == 1)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let now = now.as_unix_millis();
        let query = (0..6).fold(q(&self.sql().count_states), |q, _| q.bind(now));
        let row = idem_sql::on_conn!(self, |conn| async {
            query.fetch_one(conn).await.map_err(store_error)
        })?;
        idem_sql::decode_counts(&row).map_err(store_error)
    }
}
