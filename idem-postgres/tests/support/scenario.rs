//! What the backend tests share: a policy, an engine, identities, a
//! counter, a fixture runner, and the caller's own `orders` table of the
//! transactional tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::clock::ManualClock;
use idem_core::{Idem, IdempotencyKey, InFlightMode, Outcome, Policy, Scope};
use idem_postgres::PgStore;
use idem_postgres::sqlx::{self, Executor};

use super::PgFixture;

pub type Out = Outcome<String, String>;

pub const LEASE: Duration = Duration::from_secs(60);

pub fn policy(retries: u32) -> Policy {
    Policy::builder()
        .lease(LEASE)
        .response_ttl(Duration::from_secs(3600))
        .key_ttl(Duration::from_secs(86_400))
        .in_flight(InFlightMode::Reject)
        .store_retries(retries, Duration::from_millis(5))
        .build()
        .expect("policy")
}

pub fn engine(store: &PgStore, clock: &ManualClock) -> Idem<PgStore> {
    Idem::new(store.clone())
        .with_clock(clock.clone())
        .with_policy(policy(2))
}

pub fn scope() -> Scope {
    Scope::new(
        format!("tenant-{}", IdempotencyKey::random()),
        "POST /charges",
    )
    .expect("scope")
}

pub fn request() -> serde_json::Value {
    serde_json::json!({"amount": 100, "currency": "eur"})
}

#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);
impl Counter {
    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Runs `body` and drops the fixture's schema even if it panics.
pub async fn with_fixture<F, Fut>(fx: PgFixture, body: F)
where
    F: FnOnce(Arc<PgFixture>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let fx = Arc::new(fx);
    let result = tokio::spawn(body(Arc::clone(&fx))).await;
    fx.drop_schema().await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

pub async fn count_rows(fx: &PgFixture, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".\"{table}\"",
        fx.schema
    )))
    .fetch_one(fx.store.pool())
    .await
    .expect("count")
}

pub async fn create_orders(fx: &PgFixture) {
    fx.store
        .pool()
        .execute(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE \"{}\".orders (id bigserial PRIMARY KEY, note text NOT NULL)",
            fx.schema
        )))
        .await
        .expect("create orders");
}

pub fn insert_order(
    schema: &str,
) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".orders (note) VALUES ($1)"
    )))
}
