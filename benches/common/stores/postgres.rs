//! The raw baseline of `PgStore`: the same claim and completion statements
//! through the same pool, without the engine.
//!
//! `idem-postgres` keeps its statements private (`store.rs`,
//! `Statements::new`), so the claim and the completion are copied here for
//! the bench's own table; keep them in step. A claim is one statement, so a
//! replay is one round trip and a fresh key two (claim, complete).

use std::sync::atomic::{AtomicI64, Ordering};

use idem_postgres::PgStore;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool, Row};

use super::workload::{Ended, OPERATION, OWNER, Target, body};
use super::{LEASE_MS, TTL_MS, now_ms};

/// The claim of `idem-postgres` for table `t` (quoted, qualified).
fn claim_sql(t: &str) -> String {
    let pk = "owner = $1 AND operation = $2 AND key = $3";
    let cols = "fingerprint, state, attempt, lease_until, resource_id, outcome, \
     CASE WHEN response_expires_at > $6 THEN response END AS response, response_expires_at, key_expires_at";
    format!(
        "WITH cur AS (
            SELECT {cols},
                   key_expires_at <= $6
                   OR (fingerprint = $4
                       AND (state = 'released' OR (state = 'in_flight' AND lease_until <= $6))) AS claimable
            FROM {t} WHERE {pk}
        ),
        ins AS (
            INSERT INTO {t} (owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at)
            SELECT $1, $2, $3, $4, 'in_flight', $5, 1, $7, $8
            WHERE NOT EXISTS (SELECT 1 FROM cur)
            ON CONFLICT (owner, operation, key) DO NOTHING
            RETURNING attempt
        ),
        upd AS (
            UPDATE {t} AS r SET
                fingerprint = $4,
                state = 'in_flight',
                token = $5,
                lease_until = $7,
                attempt = CASE WHEN r.key_expires_at <= $6 THEN 1 ELSE r.attempt + 1 END,
                resource_id = CASE WHEN r.key_expires_at <= $6 THEN NULL ELSE r.resource_id END,
                key_expires_at = CASE WHEN r.key_expires_at <= $6 THEN $8 ELSE r.key_expires_at END,
                outcome = NULL,
                response = NULL,
                response_expires_at = NULL
            FROM cur
            WHERE r.owner = $1 AND r.operation = $2 AND r.key = $3 AND cur.claimable
              AND (r.key_expires_at <= $6
                   OR (r.fingerprint = $4
                       AND (r.state = 'released' OR (r.state = 'in_flight' AND r.lease_until <= $6))))
            RETURNING r.attempt, r.resource_id, cur.state AS previous_state
        )
        SELECT 'claimed' AS kind, NULL::bytea AS fingerprint, previous_state AS state, attempt,
               NULL::bigint AS lease_until, resource_id, NULL::text AS outcome, NULL::bytea AS response,
               NULL::bigint AS response_expires_at, NULL::bigint AS key_expires_at
        FROM upd
        UNION ALL
        SELECT 'claimed', NULL, NULL, attempt, NULL, NULL, NULL, NULL, NULL, NULL FROM ins
        UNION ALL
        SELECT 'existing', fingerprint, state, attempt, lease_until, resource_id, outcome, response,
               response_expires_at, key_expires_at
        FROM cur WHERE NOT claimable"
    )
}

/// The completion of `idem-postgres` for table `t`.
fn complete_sql(t: &str) -> String {
    format!(
        "UPDATE {t} SET state = 'completed', outcome = $5, response = $6, response_expires_at = $7, \
         key_expires_at = $8, resource_id = COALESCE($9, resource_id) \
         WHERE owner = $1 AND operation = $2 AND key = $3 AND token = $4 AND state = 'in_flight'"
    )
}

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
        let t = format!("\"{}\".\"{}\"", store.schema_name(), store.table_name());
        Self {
            pool: store.pool().clone(),
            claim: claim_sql(&t),
            complete: complete_sql(&t),
            fingerprint: [7; 32],
            body: body(body_len),
            tokens: AtomicI64::new(1),
        }
    }

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

impl Target for RawPostgres {
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
