//! What the backend tests share: a policy, an engine, identities, a
//! counter, a fixture runner, and the caller's own `orders` table of the
//! transactional tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::clock::ManualClock;
use idem_core::{Idem, IdempotencyKey, InFlightMode, Outcome, Policy, Scope};
use idem_mysql::MySqlStore;
use idem_mysql::sqlx::{self, Executor};

use super::MyFixture;

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

pub fn engine(store: &MySqlStore, clock: &ManualClock) -> Idem<MySqlStore> {
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

/// Runs `body` and drops the fixture's table (and its `orders` table) even
/// if it panics.
pub async fn with_fixture<F, Fut>(fx: MyFixture, body: F)
where
    F: FnOnce(Arc<MyFixture>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let fx = Arc::new(fx);
    let result = tokio::spawn(body(Arc::clone(&fx))).await;
    fx.drop_tables(&[&orders_table(&fx)]).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

pub async fn count_rows(fx: &MyFixture, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{table}`"
    )))
    .fetch_one(fx.store.pool())
    .await
    .expect("count")
}

/// The caller's own table of the transactional tests.
pub fn orders_table(fx: &MyFixture) -> String {
    format!("{}_orders", fx.table)
}

pub async fn create_orders(fx: &MyFixture) {
    fx.store
        .pool()
        .execute(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE `{}` (id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT NOT NULL) ENGINE=InnoDB",
            orders_table(fx)
        )))
        .await
        .expect("create orders");
}

pub fn insert_order(
    fx: &MyFixture,
) -> sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO `{}` (note) VALUES (?)",
        orders_table(fx)
    )))
}
