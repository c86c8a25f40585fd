//! The raw baseline of `SqliteStore`: the same statements through the same
//! pool, without the engine.
//!
//! The claim, the read and the completion are the crate's own
//! (`idem_sqlite::statements`), so the baseline cannot drift from the store.
//! The claim sequence is the store's: the read, and for an absent key the
//! conditional insert (and the read again if that lost), on one connection
//! (so a replay is one read, through the library and here alike).

use idem_sqlite::SqliteStore;
use idem_sqlite::sqlx::{self, AssertSqlSafe, Row, SqlitePool};

use super::workload::{
    OPERATION, OWNER, RawParts, Statements, complete_key_first, record_key, standing, text,
};
use super::{LEASE_MS, TTL_MS, now_ms};

/// The statements of `SqliteStore` on its own pool.
#[derive(Debug)]
pub(crate) struct RawSqlite {
    raw: RawParts<SqlitePool>,
    claim: String,
    complete: String,
    fetch: String,
}

impl RawSqlite {
    pub(crate) fn new(store: &SqliteStore, body_len: usize) -> Self {
        Self {
            raw: RawParts::new(store.pool().clone(), body_len),
            claim: text(idem_sqlite::statement(store, "claim")),
            complete: text(idem_sqlite::statement(store, "complete")),
            fetch: text(idem_sqlite::statement(store, "fetch")),
        }
    }
}

impl Statements for RawSqlite {
    /// `Ok(token)` if claimed, else the standing record's body (`None`
    /// while it is in flight). The store's sequence on one connection: the
    /// read, and only for an absent key the claim.
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        let mut conn = self.raw.pool.acquire().await.expect("acquire");
        let token = self.raw.token();
        let now = now_ms();
        let read = || {
            sqlx::query(AssertSqlSafe(self.fetch.as_str()))
                .bind(record_key(key))
                .bind(now)
        };
        if let Some(row) = read().fetch_optional(&mut *conn).await.expect("fetch") {
            return standing!(row);
        }
        let won = sqlx::query(AssertSqlSafe(self.claim.as_str()))
            .bind(OWNER)
            .bind(OPERATION)
            .bind(key)
            .bind(self.raw.fingerprint.as_slice())
            .bind(token)
            .bind(now + LEASE_MS)
            .bind(now + TTL_MS)
            .bind(now)
            .bind(record_key(key))
            .fetch_optional(&mut *conn)
            .await
            .expect("claim");
        if won.is_some() {
            return Ok(token);
        }
        let row = read()
            .fetch_optional(&mut *conn)
            .await
            .expect("fetch")
            .expect("the record that won");
        standing!(row)
    }

    async fn complete(&self, key: &str, token: i64) {
        complete_key_first!(self, key, token);
    }
}
