//! The operator API ([`AdminStore`]) of [`SqliteStore`]: indexed listing
//! with keyset pagination, release, delete and counts, one statement each.

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::{AdminStore, InFlightQuery, StoreError};
use idem_core::store::{Cursor, Page, RecordSummary, StateCounts};
use sqlx::sqlite::SqliteRow;

use crate::error::{map, row_error};
use crate::sql::q;
use crate::store::SqliteStore;

fn ms(t: Timestamp) -> i64 {
    t.as_unix_millis()
}

fn decode_summary(row: &SqliteRow) -> Result<RecordSummary, StoreError> {
    idem_sql::decode_summary::<_, i64>(row, idem_sql::text).map_err(row_error)
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
        let rows = idem_sql::on_conn!(self, |conn| async {
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
        let done = idem_sql::on_conn!(self, |conn| async {
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
        let done = idem_sql::on_conn!(self, |conn| async {
            query.execute(conn).await.map_err(map)
        })?;
        Ok(done.rows_affected() == 1)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let query = q(&self.sql().count_states).bind(ms(now));
        let row = idem_sql::on_conn!(self, |conn| async {
            query.fetch_one(conn).await.map_err(map)
        })?;
        idem_sql::decode_counts(&row).map_err(map)
    }
}
