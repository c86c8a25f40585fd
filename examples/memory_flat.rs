//! Does the engine keep anything per key? A million fresh keys through
//! `Idem::execute` against a store that discards every record, with the
//! process's resident memory read from `/proc/self/status` along the way.
//!
//! Run with: `cargo run --release --example memory_flat`
//! (`IDEM_FLAT_KEYS` sets the number of keys, default 1,000,000).
//!
//! A `MemoryStore` would grow by design (it holds the records); a store that
//! keeps nothing isolates what the engine itself holds: if peak RSS stays
//! flat from 100,000 to 1,000,000 keys, nothing in the process grows with the
//! number of stored keys. Linux only (it reads `/proc/self/status`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem::clock::Timestamp;
use idem::store::PurgeReport;
use idem::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, Store, StoreError, StoredRecord,
    Token,
};
use idem::{Idem, Outcome, RecordId, Scope};
use serde_json::json;

/// Claims always win, completions are dropped: nothing is kept.
#[derive(Debug, Default)]
struct DiscardStore;

impl Store for DiscardStore {
    async fn claim(&self, _req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        Ok(ClaimOutcome::Claimed(Claimed {
            attempt: 1,
            previous: None,
        }))
    }

    async fn complete(&self, _: &RecordId, _: Token, _: &Completion<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn release(&self, _: &RecordId, _: Token, _: Timestamp) -> Result<(), StoreError> {
        Ok(())
    }

    async fn save_resource_id(&self, _: &RecordId, _: Token, _: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn extend_lease(&self, _: &RecordId, _: Token, _: Timestamp) -> Result<(), StoreError> {
        Ok(())
    }

    async fn fetch(&self, _: &RecordId, _: Timestamp) -> Result<Option<StoredRecord>, StoreError> {
        Ok(None)
    }

    async fn purge_expired(&self, _: Timestamp, _: u32) -> Result<PurgeReport, StoreError> {
        Ok(PurgeReport::default())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

/// `VmRSS` and `VmHWM` (peak) in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn fresh_keys(idem: &Idem<DiscardStore>, from: u64, to: u64) {
    let next = Arc::new(AtomicU64::new(from));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let idem = idem.clone();
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                let scope = Scope::new("acct_42", "POST /payments").expect("valid scope");
                let request =
                    json!({"amount": 1000, "currency": "eur", "customer": "cus_4QFpXhT2"});
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= to {
                        break;
                    }
                    let reply = idem
                        .execute(&scope, format!("order-{n}"), &request, |_| async {
                            Outcome::<_, String>::Success("ch_1".repeat(64))
                        })
                        .await
                        .expect("execute");
                    assert!(!reply.is_replay());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let total: u64 = std::env::var("IDEM_FLAT_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let idem = Idem::new(DiscardStore);
    let (rss, peak) = rss_kib();
    println!("{:>9} keys: VmRSS {rss:>7} KiB, VmHWM {peak:>7} KiB", 0);
    let mut done = 0;
    let start = std::time::Instant::now();
    for checkpoint in [10_000, 100_000, 250_000, 500_000, 750_000, 1_000_000] {
        let checkpoint = checkpoint.min(total);
        if checkpoint <= done {
            continue;
        }
        fresh_keys(&idem, done, checkpoint).await;
        done = checkpoint;
        let (rss, peak) = rss_kib();
        println!("{done:>9} keys: VmRSS {rss:>7} KiB, VmHWM {peak:>7} KiB");
    }
    println!(
        "{done} fresh keys in {:.1} s through Idem::execute (store keeps nothing)",
        start.elapsed().as_secs_f64()
    );
}
