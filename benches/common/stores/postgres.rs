//! The raw baseline of `PgStore`: the same claim and completion statements
//! through the same pool, without the engine.
//!
//! The claim and the completion are the store's own statements for the
//! bench's table (`idem_postgres::statements`), so the
//! baseline cannot drift from the store. A claim is one statement, so a
//! replay is one round trip and a fresh key two (claim, complete).

use std::sync::atomic::{AtomicI64, Ordering};

use idem_postgres::PgStore;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool, Row};

use super::workload::{OPERATION, OWNER, Statements, body, record_key};
use super::{LEASE_MS, TTL_MS, now_ms};

/// The statements of `PgStore` on its own pool.
#[derive(Debug)]
pub(crate) struct RawPostgres {
    pool: PgPool,
    claim: String,
    complete: String,
    fingerprint: [u8; 32],
    body: Vec<u8>,
    tokens: AtomicI64,
}

impl RawPostgres {
    pub(crate) fn new(store: &PgStore, body_len: usize) -> Self {
        Self {
            pool: store.pool().clone(),
            claim: idem_postgres::statements::claim(store).to_owned(),
            complete: idem_postgres::statements::complete(store).to_owned(),
            fingerprint: [7; 32],
            body: body(body_len),
            tokens: AtomicI64::new(1),
        }
    }
}

impl Statements for RawPostgres {
    /// `Ok(token)` if claimed, else the standing record's body (`None` while
    /// it is in flight). A lost race (no row) is run again, as the store does.
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        loop {
            let token = self.tokens.fetch_add(1, Ordering::Relaxed);
            let now = now_ms();
            let row = sqlx::query(AssertSqlSafe(self.claim.as_str()))
                .bind(OWNER)
                .bind(OPERATION)
                .bind(key)
                .bind(self.fingerprint.as_slice())
                .bind(token)
                .bind(now)
                .bind(now + LEASE_MS)
                .bind(now + TTL_MS)
                .bind(record_key(key))
                .fetch_optional(&self.pool)
                .await
                .expect("claim");
            let Some(row) = row else { continue };
            let kind: String = row.get("kind");
            if kind == "claimed" {
                return Ok(token);
            }
            let state: String = row.get("state");
            return Err((state == "completed").then(|| row.get("response")));
        }
    }

    async fn complete(&self, key: &str, token: i64) {
        let now = now_ms();
        let done = sqlx::query(AssertSqlSafe(self.complete.as_str()))
            .bind(record_key(key))
            .bind(token)
            .bind("success")
            .bind(self.body.as_slice())
            .bind(now + TTL_MS)
            .bind(now + TTL_MS)
            .bind(None::<&str>)
            .execute(&self.pool)
            .await
            .expect("complete");
        assert_eq!(done.rows_affected(), 1, "lease lost");
    }
}
