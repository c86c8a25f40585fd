//! A small payments endpoint made safe to retry, on the embedded SQLite default.
//!
//! Run with: `cargo run --example quickstart`
//!
//! It walks through the contract: a first call, a replay returning the same
//! charge, a reused key with another amount rejected, a concurrent duplicate
//! getting 409, a transient provider failure released and retried, and a crash
//! recovered through the downstream key (no double charge).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::clock::ManualClock;
use idem::sqlite::SqliteStore;
use idem::{Attempt, Error, Failure, Idem, Outcome, Scope};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What the endpoint returns (stored and replayed).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
}

/// A permanent failure (stored and replayed) or a transient one (released).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PaymentError {
    code: String,
}

// Both are stored as their JSON.
idem::storable_as_json!(Charge, PaymentError);

/// A simulated payment provider that, like Stripe, dedups on an idempotency key.
#[derive(Debug, Default)]
struct Provider {
    charges: Mutex<HashMap<String, Charge>>,
    created: AtomicUsize,
    fail_next: AtomicUsize,
    die_after_next_charge: std::sync::atomic::AtomicBool,
}

impl Provider {
    async fn charge(&self, idempotency_key: &str, amount: u64) -> Result<Charge, PaymentError> {
        tokio::time::sleep(Duration::from_millis(20)).await; // network
        if self.fail_next.load(Ordering::SeqCst) > 0 {
            self.fail_next.fetch_sub(1, Ordering::SeqCst);
            return Err(PaymentError {
                code: "provider_503".into(),
            });
        }
        let charge = {
            let mut charges = self.charges.lock().expect("provider lock");
            let charge = charges
                .entry(idempotency_key.to_owned())
                .or_insert_with(|| {
                    let n = self.created.fetch_add(1, Ordering::SeqCst) + 1;
                    Charge {
                        id: format!("ch_{n:04}"),
                        amount,
                    }
                });
            charge.clone()
        };
        if self.die_after_next_charge.swap(false, Ordering::SeqCst) {
            // Simulates the process dying right after the provider charged:
            // the answer never arrives and the outcome is never stored.
            std::future::pending::<()>().await;
        }
        Ok(charge)
    }
}

/// The endpoint's work: charge through the downstream key, classify failures.
async fn charge_card(
    provider: Arc<Provider>,
    attempt: Attempt,
    amount: u64,
) -> Result<Charge, Failure<PaymentError>> {
    if attempt.is_recovery() {
        println!(
            "      (attempt {} is a recovery: reconciling with the provider first)",
            attempt.number()
        );
    }
    // Same value on every attempt of this record, so a re-run is a retry at the provider.
    let key = attempt.downstream_key("provider-charge", 1);
    // A provider failure is transient here: the key is released for a retry.
    let charge = provider
        .charge(&key, amount)
        .await
        .map_err(Failure::transient)?;
    attempt.set_resource_id(&charge.id);
    Ok(charge)
}

fn show(label: &str, result: &Result<idem::Reply<Charge, PaymentError>, Error>) {
    match result {
        Ok(reply) => {
            let how = if reply.is_replay() {
                "replayed"
            } else {
                "executed"
            };
            match reply.outcome() {
                Outcome::Success(c) => {
                    println!("{label}: 200 {how}, charge {} for {}", c.id, c.amount)
                }
                Outcome::Failure(e) => println!("{label}: {how}, permanent failure {}", e.code),
                Outcome::Transient(e) => {
                    println!(
                        "{label}: {how}, transient failure {}: key released, not stored",
                        e.code
                    );
                }
            }
        }
        Err(e) => {
            let retry = e
                .retry_after()
                .map(|d| format!(", Retry-After: {}s", d.as_secs()))
                .unwrap_or_default();
            println!("{label}: {} {e}{retry}", e.http_status());
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("idem-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("idem.db");
    println!("idem quickstart: records in {}\n", path.display());

    let clock = ManualClock::starting_now(); // real time, but we can fast-forward it
    let idem = Idem::new(SqliteStore::open(&path).await?).with_clock(clock.clone());
    let provider = Arc::new(Provider::default());
    let scope = Scope::new("acct_42", "POST /payments")?;
    let pay = |key: &'static str, amount: u64| {
        let (idem, scope, provider) = (idem.clone(), scope.clone(), Arc::clone(&provider));
        async move {
            idem.execute(
                &scope,
                key,
                &json!({"amount": amount, "currency": "eur"}),
                |attempt| charge_card(provider, attempt, amount),
            )
            .await
        }
    };

    println!("1. A first call runs the work once:");
    show("   POST key=order-1 amount=100", &pay("order-1", 100).await);

    println!("2. A retry with the same key gets the same charge back, marked as a replay:");
    show("   POST key=order-1 amount=100", &pay("order-1", 100).await);

    println!("3. The same key with another amount is rejected; nothing runs:");
    show("   POST key=order-1 amount=999", &pay("order-1", 999).await);

    println!("4. A duplicate that arrives while the first is still running gets 409:");
    let first = tokio::spawn(pay("order-2", 250));
    tokio::time::sleep(Duration::from_millis(5)).await;
    show(
        "   POST key=order-2 (duplicate)",
        &pay("order-2", 250).await,
    );
    show("   POST key=order-2 (first)    ", &first.await?);

    println!("5. A transient provider failure releases the key; the retry runs again:");
    provider.fail_next.store(1, Ordering::SeqCst);
    show("   POST key=order-3 amount=75", &pay("order-3", 75).await);
    show("   POST key=order-3 amount=75", &pay("order-3", 75).await);

    println!("6. A crash after the provider charged, before the outcome was stored:");
    provider.die_after_next_charge.store(true, Ordering::SeqCst);
    let crashed = tokio::spawn(pay("order-4", 500));
    tokio::time::sleep(Duration::from_millis(100)).await; // the provider has charged by now
    crashed.abort(); // the process is gone: no outcome stored, the record stays in flight
    let _ = crashed.await;
    println!(
        "   the provider holds {} charges",
        provider.created.load(Ordering::SeqCst)
    );
    show(
        "   POST key=order-4 (retry at once)",
        &pay("order-4", 500).await,
    );
    clock.advance(Duration::from_secs(61)); // fast-forward past the 60 s lease
    show(
        "   POST key=order-4 (after lease)  ",
        &pay("order-4", 500).await,
    );
    println!(
        "   the provider still holds {} charges: the recovery reused the downstream key",
        provider.created.load(Ordering::SeqCst)
    );

    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
