//! The raw baseline of `PgStore`: the same claim and completion statements
//! through the same pool, without the engine.
//!
//! The claim and the completion are the store's own statements for the
//! bench's table (`idem_postgres::statements`), so the
//! baseline cannot drift from the store. A claim is one statement, so a
//! replay is one round trip and a fresh key two (claim, complete).

use idem_postgres::PgStore;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool, Row};

use super::workload::{
    OPERATION, OWNER, RawParts, Statements, complete_key_first, record_key, standing, text,
};
use super::{LEASE_MS, TTL_MS, now_ms};

/// The statements of `PgStore` on its own pool.
#[derive(Debug)]
pub(crate) struct RawPostgres {
    raw: RawParts<PgPool>,
    claim: String,
    complete: String,
}

impl RawPostgres {
    pub(crate) fn new(store: &PgStore, body_len: usize) -> Self {
        Self {
            raw: RawParts::new(store.pool().clone(), body_len),
            claim: text(idem_postgres::statement(store, "claim")),
            complete: text(idem_postgres::statement(store, "complete")),
        }
    }
}

impl Statements for RawPostgres {
    /// `Ok(token)` if claimed, else the standing record's body (`None` while
    /// it is in flight). A lost race (no row) is run again, as the store does.
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        loop {
            let token = self.raw.token();
            let now = now_ms();
            let row = sqlx::query(AssertSqlSafe(self.claim.as_str()))
                .bind(OWNER)
                .bind(OPERATION)
                .bind(key)
                .bind(self.raw.fingerprint.as_slice())
                .bind(token)
                .bind(now)
                .bind(now + LEASE_MS)
                .bind(now + TTL_MS)
                .bind(record_key(key))
                .fetch_optional(&self.raw.pool)
                .await
                .expect("claim");
            let Some(row) = row else { continue };
            let kind: String = row.get("kind");
            if kind == "claimed" {
                return Ok(token);
            }
            return standing!(row);
        }
    }

    async fn complete(&self, key: &str, token: i64) {
        complete_key_first!(self, key, token);
    }
}
