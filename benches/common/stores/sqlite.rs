//! The raw baseline of `SqliteStore`: the same statements through the same
//! pool, without the engine.
//!
//! `idem-sqlite` keeps its statements private (`schema.rs`), so the claim,
//! the read and the completion are copied here verbatim; keep them in step.
//! The claim sequence is the store's: the conditional insert, and when it
//! returns no row, the read of the standing record (so a replay is two
//! statements, through the library and here alike).

use std::sync::atomic::{AtomicI64, Ordering};

use idem_sqlite::SqliteStore;
use idem_sqlite::sqlx::{self, Row, SqlitePool};

use super::workload::{Ended, OPERATION, OWNER, Target, body};
use super::{LEASE_MS, TTL_MS, now_ms};

/// Copied from `idem-sqlite/src/schema.rs` (`CLAIM`).
const CLAIM: &str = "
INSERT INTO idem_records
    (owner, operation, key, fingerprint, state, token, attempt, lease_until,
     takeover, resource_id, outcome, response, response_expires_at, key_expires_at)
VALUES (?1, ?2, ?3, ?4, 'in_flight', ?5, 1, ?6, NULL, NULL, NULL, NULL, NULL, ?7)
ON CONFLICT (owner, operation, key) DO UPDATE SET
    takeover = CASE
        WHEN idem_records.key_expires_at <= ?8 THEN NULL
        WHEN idem_records.state = 'released' THEN 'released'
        ELSE 'lease_expired' END,
    attempt = CASE WHEN idem_records.key_expires_at <= ?8 THEN 1 ELSE idem_records.attempt + 1 END,
    resource_id = CASE WHEN idem_records.key_expires_at <= ?8 THEN NULL ELSE idem_records.resource_id END,
    key_expires_at = CASE WHEN idem_records.key_expires_at <= ?8
        THEN excluded.key_expires_at ELSE idem_records.key_expires_at END,
    fingerprint = excluded.fingerprint,
    state = 'in_flight',
    token = excluded.token,
    lease_until = excluded.lease_until,
    outcome = NULL,
    response = NULL,
    response_expires_at = NULL
WHERE idem_records.key_expires_at <= ?8
   OR (idem_records.fingerprint = excluded.fingerprint
       AND (idem_records.state = 'released'
            OR (idem_records.state = 'in_flight' AND idem_records.lease_until <= ?8)))
RETURNING attempt, takeover, resource_id";

/// Copied from `idem-sqlite/src/schema.rs` (`FETCH`).
const FETCH: &str = "
SELECT fingerprint, state, attempt, lease_until, resource_id, outcome,
       CASE WHEN response_expires_at > ?4 THEN response END AS response,
       response_expires_at, key_expires_at
FROM idem_records
WHERE owner = ?1 AND operation = ?2 AND key = ?3 AND key_expires_at > ?4";

/// Copied from `idem-sqlite/src/schema.rs` (`COMPLETE`).
const COMPLETE: &str = "UPDATE idem_records SET state = 'completed', outcome = ?5, response = ?6, \
     response_expires_at = ?7, key_expires_at = ?8, resource_id = COALESCE(?9, resource_id) \
     WHERE owner = ?1 AND operation = ?2 AND key = ?3 AND token = ?4 AND state = 'in_flight'";

/// The statements of `SqliteStore` on its own pool.
#[derive(Debug)]
pub(crate) struct RawSqlite {
    pool: SqlitePool,
    fingerprint: [u8; 32],
    body: Vec<u8>,
    tokens: AtomicI64,
}

impl RawSqlite {
    pub(crate) fn new(store: &SqliteStore, body_len: usize) -> Self {
        Self {
            pool: store.pool().clone(),
            fingerprint: [7; 32],
            body: body(body_len),
            tokens: AtomicI64::new(1),
        }
    }

    /// `Ok(token)` if claimed, else the standing record's body (`None`
    /// while it is in flight).
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let won = sqlx::query(CLAIM)
            .bind(OWNER)
            .bind(OPERATION)
            .bind(key)
            .bind(self.fingerprint.as_slice())
            .bind(token)
            .bind(now + LEASE_MS)
            .bind(now + TTL_MS)
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .expect("claim");
        if won.is_some() {
            return Ok(token);
        }
        let row = sqlx::query(FETCH)
            .bind(OWNER)
            .bind(OPERATION)
            .bind(key)
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .expect("fetch");
        let state: String = row.get("state");
        Err((state == "completed").then(|| row.get("response")))
    }

    async fn complete(&self, key: &str, token: i64) {
        let now = now_ms();
        let done = sqlx::query(COMPLETE)
            .bind(OWNER)
            .bind(OPERATION)
            .bind(key)
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

impl Target for RawSqlite {
    async fn fresh(&self, key: &str) {
        let token = self.claim(key).await.expect("fresh key");
        self.complete(key, token).await;
    }

    async fn replay(&self, key: &str) {
        let body = self.claim(key).await.expect_err("completed key");
        std::hint::black_box(body.expect("stored body"));
    }

    async fn contended(&self, key: &str) -> Ended {
        match self.claim(key).await {
            Ok(token) => {
                self.complete(key, token).await;
                Ended::Executed
            }
            Err(Some(body)) => {
                std::hint::black_box(body);
                Ended::Replayed
            }
            Err(None) => Ended::Conflict,
        }
    }
}
