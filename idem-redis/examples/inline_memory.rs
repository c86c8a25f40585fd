//! What a body kept inside its record costs in Redis's memory
//! ([`RedisStore::with_inline_body_limit`]).
//!
//! For each body size it completes `IDEM_KEYS` keys (default 10,000) through
//! the store on `IDEM_REDIS_URL`, once with the body in the body key (the
//! default) and once inside the record, and prints per key: `MEMORY USAGE`
//! of the record and of its body key (one key sampled, `SAMPLES 0`), and
//! `used_memory` of `INFO memory` grown over all the keys divided by their
//! number (which adds the keyspace's and the expiry table's own entries).
//! The identity is a UUID-sized key in a scope of two short parts. Run it
//! against a throwaway server, never a shared one (it reads the server's
//! whole memory, and deletes its own keys at the end):
//!
//! ```text
//! redis-server --port 7103 --save '' --appendonly no &
//! IDEM_REDIS_URL=redis://127.0.0.1:7103/ cargo run --release -p idem-redis --example inline_memory
//! ```

use idem_core::clock::{Clock, SystemClock};
use idem_core::store::Fingerprint;
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimRequest, Completion, Store, Token};
use idem_core::{IdempotencyKey, RecordId, Scope};
use idem_redis::RedisStore;
use idem_redis::redis::{self, aio::MultiplexedConnection};
use idem_test_support::redis_admin;
use std::time::Duration;

async fn used_memory(admin: &mut MultiplexedConnection) -> i64 {
    redis_admin::info(admin, "memory")
        .await
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

async fn usage(admin: &mut MultiplexedConnection, key: &str) -> i64 {
    let v: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(admin)
        .await
        .expect("MEMORY USAGE");
    v.unwrap_or(0)
}

/// Completes `n` keys with `body` on `store`; returns (record, body key,
/// used_memory per key).
async fn run(
    store: &RedisStore,
    admin: &mut MultiplexedConnection,
    body: &[u8],
    n: usize,
) -> [i64; 3] {
    let scope = Scope::new("acct_42", "POST /payments").expect("scope");
    let clock = SystemClock;
    let before = used_memory(admin).await;
    let mut last = None;
    for _ in 0..n {
        let id = RecordId::new(scope.clone(), IdempotencyKey::random());
        let now = clock.now();
        let token = Token::random();
        let req = ClaimRequest::new(
            &id,
            Fingerprint::from_slice(&[7; 32]).expect("fingerprint"),
            token,
            now,
            now.plus(Duration::from_secs(60)),
            now.plus(Duration::from_secs(30 * 86_400)),
        );
        store.claim(&req).await.expect("claim");
        let done = Completion::new(
            OutcomeKind::Success,
            Some(body),
            Some("ch_3MqLiJ2eZvKYlo2C0XjT1a9b"),
            now,
            now.plus(Duration::from_secs(86_400)),
            now.plus(Duration::from_secs(30 * 86_400)),
        );
        store.complete(&id, token, &done).await.expect("complete");
        last = Some(id);
    }
    let per_key = (used_memory(admin).await - before) / i64::try_from(n).expect("n");
    let id = last.expect("one key");
    [
        usage(admin, &store.record_key(&id)).await,
        usage(admin, &store.body_key(&id)).await,
        per_key,
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let n: usize = std::env::var("IDEM_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut admin = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis reachable");
    let prefix = format!("idem-memory-{}:", std::process::id());
    let base = RedisStore::connect(&url)
        .await
        .expect("connect")
        .with_prefix(&prefix)
        .expect("prefix");
    println!(
        "| body | where | MEMORY USAGE record | MEMORY USAGE body key | used_memory per key ({n} keys) |"
    );
    println!("|---:|---|---:|---:|---:|");
    for len in [0, 256, 1024, 4096] {
        let body = vec![b'x'; len];
        for (where_, limit) in [("body key", 0), ("inside the record", 8192)] {
            let store = base.clone().with_inline_body_limit(limit);
            let [record, body_key, per_key] = run(&store, &mut admin, &body, n).await;
            redis_admin::unlink_all(&mut admin, &prefix).await;
            println!("| {len} B | {where_} | {record} | {body_key} | {per_key} |");
        }
    }
}
