//! A payment endpoint on PostgreSQL, in transactional mode.
//!
//! Run with:
//!
//! ```text
//! cargo run --example postgres_payments --features postgres
//! ```
//!
//! The server URL comes from `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). The example creates the schema
//! `idem_payments_example` for its records and its ledger, and drops it at the end.
//!
//! What it shows, step by step:
//!
//! 1. The charge goes to a (simulated) payment provider under
//!    `attempt.downstream_key(..)`, and the ledger row is written in the
//!    same transaction as the idempotency record.
//! 2. The process "crashes" after the provider charged the card and before
//!    the ledger write committed: the transaction rolls back, so neither the
//!    record nor a ledger row remains, but the charge exists at the provider.
//! 3. The client retries with the same key: the work looks the charge up by
//!    its downstream key, finds it, and records it without charging again.
//! 4. Further retries replay the stored response; another request under the
//!    same key is refused (422).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem::postgres::sqlx::Executor;
use idem::postgres::{PgIdemExt, PgStore, sqlx};
use idem::{Idem, Outcome, Scope};
use serde::{Deserialize, Serialize};

const SCHEMA: &str = "idem_payments_example";

/// A charge as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: i64,
}

idem::storable_as_json!(Charge);

/// A payment provider that, like Stripe, deduplicates on an idempotency key.
#[derive(Debug, Default)]
struct Provider {
    charges: Mutex<HashMap<String, Charge>>,
}

impl Provider {
    fn find(&self, key: &str) -> Option<Charge> {
        self.charges.lock().ok()?.get(key).cloned()
    }

    fn charge(&self, key: &str, amount: i64) -> Charge {
        let mut charges = self
            .charges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = charges.len() + 1;
        charges
            .entry(key.to_owned())
            .or_insert_with(|| Charge {
                id: format!("ch_{n:04}"),
                amount,
            })
            .clone()
    }

    fn count(&self) -> usize {
        self.charges.lock().map(|c| c.len()).unwrap_or(0)
    }
}

/// POST /payments: charge, then record the charge in the ledger, in the
/// transaction that holds the idempotency record.
async fn pay(
    idem: &Idem<PgStore>,
    provider: &Arc<Provider>,
    scope: &Scope,
    key: &str,
    amount: i64,
    crash_before_ledger: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<idem::Reply<Charge, String>, idem::Error> {
    let provider = Arc::clone(provider);
    let request = serde_json::json!({ "amount": amount, "currency": "eur" });
    idem.execute_in_tx(scope, key, &request, move |attempt, conn| {
        Box::pin(async move {
            let provider_key = attempt.downstream_key("provider-charge", 1);
            let charge = match provider.find(&provider_key) {
                Some(existing) => {
                    println!("   work: reconciled with the provider: {} already exists, not charging again", existing.id);
                    existing
                }
                None => {
                    let charge = provider.charge(&provider_key, amount);
                    println!("   work: charged {} at the provider (key {}…)", charge.id, &provider_key[..12]);
                    charge
                }
            };
            attempt.set_resource_id(charge.id.clone());
            if let Some(crash) = crash_before_ledger {
                println!("   work: *** crash before the ledger write commits ***");
                let _ = crash.send(());
                std::future::pending::<()>().await;
            }
            let ledger = format!("INSERT INTO {SCHEMA}.ledger (charge_id, amount) VALUES ($1, $2)");
            let written = sqlx::query(sqlx::AssertSqlSafe(ledger))
                .bind(&charge.id)
                .bind(charge.amount)
                .execute(&mut *conn)
                .await;
            match written {
                Ok(_) => {
                    println!("   work: ledger row written for {}", charge.id);
                    Outcome::Success(charge)
                }
                Err(e) => Outcome::Transient(format!("ledger write failed: {e}")),
            }
        })
    })
    .await
}

async fn count(pool: &sqlx::PgPool, sql: &'static str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(sql).fetch_one(pool).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let store = PgStore::connect(&url)
        .await
        .map_err(|e| {
            format!("cannot reach PostgreSQL at {url}: {e} (start it, or set DATABASE_URL)")
        })?
        .with_schema_name(SCHEMA)?;
    let pool = store.pool().clone();
    pool.execute(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"
    )))
    .await?;
    store.migrate().await?;
    pool.execute(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {SCHEMA}.ledger (id bigserial PRIMARY KEY, charge_id text NOT NULL UNIQUE, amount bigint NOT NULL)"
    )))
    .await?;
    println!("records in {SCHEMA}.idem_records, ledger in {SCHEMA}.ledger\n");

    let idem = Idem::new(store);
    let provider = Arc::new(Provider::default());
    let scope = Scope::new("acct_42", "POST /payments")?;
    let key = "order-1001";

    println!("1. POST /payments (key {key}), and the process crashes mid-way");
    let (crashed_tx, crashed) = tokio::sync::oneshot::channel();
    let first = {
        let (idem, provider, scope) = (idem.clone(), Arc::clone(&provider), scope.clone());
        tokio::spawn(
            async move { pay(&idem, &provider, &scope, key, 1000, Some(crashed_tx)).await },
        )
    };
    crashed.await?;
    first.abort(); // the process dies: the open transaction rolls back
    let _ = first.await;
    // Give the pool a moment to roll the abandoned transaction back.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    println!(
        "   after the crash: provider charges = {}, ledger rows = {}, records = {}\n",
        provider.count(),
        count(&pool, "SELECT count(*) FROM idem_payments_example.ledger").await?,
        count(
            &pool,
            "SELECT count(*) FROM idem_payments_example.idem_records"
        )
        .await?,
    );

    println!("2. the client retries with the same key");
    let reply = pay(&idem, &provider, &scope, key, 1000, None).await?;
    println!(
        "   → {:?}, replayed: {}\n",
        reply.outcome(),
        reply.is_replay()
    );

    println!("3. and retries again");
    let reply = pay(&idem, &provider, &scope, key, 1000, None).await?;
    println!(
        "   → {:?}, replayed: {} (the work did not run)\n",
        reply.outcome(),
        reply.is_replay()
    );

    println!("4. the same key with another amount");
    match pay(&idem, &provider, &scope, key, 5000, None).await {
        Err(e) => println!("   → HTTP {}: {e}\n", e.http_status()),
        Ok(r) => println!("   → unexpected: {r:?}\n"),
    }

    let ledger = count(&pool, "SELECT count(*) FROM idem_payments_example.ledger").await?;
    println!(
        "in the end: provider charges = {}, ledger rows = {ledger}",
        provider.count()
    );
    assert_eq!(
        (provider.count(), ledger),
        (1, 1),
        "charged once, recorded once"
    );
    pool.execute(sqlx::AssertSqlSafe(format!("DROP SCHEMA {SCHEMA} CASCADE")))
        .await?;
    Ok(())
}
