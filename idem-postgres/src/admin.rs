//! The operator API ([`AdminStore`]) of [`PgStore`]: indexed listing with
//! keyset pagination, release, delete and counts, one statement each.

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::{AdminStore, InFlightQuery, StoreError};
use idem_core::store::{Cursor, Page, RecordSummary, StateCounts};
use sqlx::postgres::PgRow;

use crate::error::{Error, store_error};
use crate::sql::q;
use crate::store::PgStore;

fn decode_summary(row: &PgRow) -> Result<RecordSummary, Error> {
    Ok(idem_sql::decode_summary::<_, i32>(row, idem_sql::text)?)
}

/// Indexed listing with keyset pagination (the `_sweep_idx` index, where an
/// in-flight record sits at its lease end); release, delete and counts are one statement each. Counting scans
/// the table.
impl AdminStore for PgStore {
    async fn list_in_flight(&self, qr: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        let limit = qr.limit.max(1);
        let after = qr.cursor.map(Cursor::keyset_position).transpose()?;
        let query = match &after {
            None => q(&self.sql().list_in_flight),
            Some(_) => q(&self.sql().list_in_flight_after),
        }
        .bind(qr.lease_before.as_unix_millis())
        .bind(qr.now.as_unix_millis())
        .bind(i64::from(limit) + 1);
        let query = match after {
            None => query,
            Some(a) => query
                .bind(a.lease_until.as_unix_millis())
                .bind(a.owner)
                .bind(a.operation)
                .bind(a.key),
        };
        let rows: Result<Vec<PgRow>, Error> =
            idem_sql::on_conn!(self, |conn| async { Ok(query.fetch_all(conn).await?) });
        let rows = rows?;
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
        let done: Result<_, Error> = idem_sql::on_conn!(self, |conn| async {
            let done = q(&self.sql().release_in_flight)
                .bind(id.owner())
                .bind(id.operation())
                .bind(id.key().as_str())
                .bind(now.as_unix_millis())
                .bind(attempt)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        });
        Ok(done?)
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let done: Result<_, Error> = idem_sql::on_conn!(self, |conn| async {
            let done = q(&self.sql().delete_completed)
                .bind(id.owner())
                .bind(id.operation())
                .bind(id.key().as_str())
                .bind(now.as_unix_millis())
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        });
        Ok(done?)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let row: Result<PgRow, Error> = idem_sql::on_conn!(self, |conn| async {
            Ok(q(&self.sql().count_states)
                .bind(now.as_unix_millis())
                .fetch_one(conn)
                .await?)
        });
        let row = row?;
        idem_sql::decode_counts(&row).map_err(store_error)
    }
}
