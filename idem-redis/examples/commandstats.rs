//! Redis time per store operation, from `INFO commandstats`.
//!
//! Through [`RedisStore`] on `IDEM_REDIS_URL`, 16 tasks on one store, runs
//! three phases over `IDEM_OPS` keys (default 20,000): claims of new keys,
//! their completions (an `IDEM_BODY`-byte body, default 256), then replays
//! (claims of the completed keys), bodies of up to `IDEM_INLINE` bytes kept
//! inside their record (default 0: none). Per phase it prints the commands Redis ran
//! per operation, the microseconds they took (`usec` of `INFO commandstats`,
//! reset with `CONFIG RESETSTAT` before each phase; for a script, its own
//! `usec`, which includes the commands it ran) and Redis's whole CPU time per
//! operation (`INFO cpu`: parsing, replies and system calls included). Run
//! it against a throwaway server pinned to a core, never a shared one (it
//! resets the statistics):
//!
//! ```text
//! taskset -c 0 redis-server --port 7101 --save '' --appendonly no &
//! IDEM_REDIS_URL=redis://127.0.0.1:7101/ taskset -c 1 \
//!     cargo run -p idem-redis --example commandstats
//! ```
//!
//! For instruction counts, robust on a loaded machine, run the server under
//! callgrind, which then writes one profile per phase (`.out.2` claims,
//! `.out.3` completions, `.out.4` replays; divide their totals by
//! `IDEM_OPS`):
//!
//! ```text
//! valgrind --tool=callgrind --dump-before=configResetStatCommand \
//!     --callgrind-out-file=/tmp/redis.out redis-server --port 7102 --save '' &
//! IDEM_OPS=2000 IDEM_REDIS_URL=redis://127.0.0.1:7102/ \
//!     cargo run -p idem-redis --example commandstats
//! grep ^summary: /tmp/redis.out.*
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::clock::{Clock, SystemClock, Timestamp};
use idem_core::store::{ClaimOutcome, ClaimRequest, Completion, Store, Token};
use idem_core::store::{Fingerprint, OutcomeKind};
use idem_core::{IdempotencyKey, RecordId, Scope};
use idem_redis::RedisStore;
use idem_redis::redis::aio::MultiplexedConnection;
use idem_redis::redis::{self};
use idem_test_support::redis_admin;

const TASKS: usize = 16;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `name → (calls, usec)` of every command.
async fn stats(admin: &mut MultiplexedConnection) -> BTreeMap<String, (u64, u64)> {
    redis_admin::info(admin, "commandstats")
        .await
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| -> Option<u64> {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .filter(|(n, _)| n != "info" && !n.starts_with("config"))
        .collect()
}

async fn reset(admin: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await
        .expect("RESETSTAT");
}

/// Redis's own CPU time so far (`used_cpu_sys + used_cpu_user`), in µs.
async fn cpu(admin: &mut MultiplexedConnection) -> f64 {
    redis_admin::info(admin, "cpu")
        .await
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k == "used_cpu_sys" || k == "used_cpu_user")
                .then(|| v.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum::<f64>()
        * 1e6
}

/// A success at `now` with `body`, kept `ttl` (response and key alike).
fn success(now: Timestamp, body: &[u8], ttl: Duration) -> Completion<'_> {
    Completion::new(
        OutcomeKind::Success,
        Some(body),
        None,
        now,
        now.plus(ttl),
        now.plus(ttl),
    )
}

fn report(what: &str, ops: usize, s: &BTreeMap<String, (u64, u64)>, cpu_us: f64) {
    let calls: u64 = s.values().map(|(c, _)| c).sum();
    // Each phase runs one kind of call: with a script in it, every other
    // command ran inside the script (whose `usec` includes theirs).
    let top: u64 = match s.get("evalsha") {
        Some((_, usec)) => *usec,
        None => s.values().map(|(_, u)| u).sum(),
    };
    let per: Vec<String> = s
        .iter()
        .map(|(n, (c, u))| {
            format!(
                "{n} {:.2}/op {:.2} µs/call",
                *c as f64 / ops as f64,
                *u as f64 / (*c).max(1) as f64
            )
        })
        .collect();
    println!(
        "{what}: {:.2} commands/op (inside scripts included), {:.2} µs/op in commands \
         (commandstats), {:.2} µs/op of Redis CPU (INFO cpu) [{}]",
        calls as f64 / ops as f64,
        top as f64 / ops as f64,
        cpu_us / ops as f64,
        per.join("; ")
    );
}

#[tokio::main]
async fn main() {
    let url =
        std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:7101/".to_owned());
    let ops = env("IDEM_OPS", 20_000);
    let body = vec![b'x'; env("IDEM_BODY", 256)];
    let prefix = format!("idem-cs-{}:", std::process::id());
    let store = RedisStore::connect(&url)
        .await
        .expect("connect")
        .with_prefix(&prefix)
        .expect("prefix")
        .with_inline_body_limit(env("IDEM_INLINE", 0));
    let mut admin = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("admin");
    let scope = Scope::new("owner", "POST /bench").expect("scope");
    let ids: Arc<Vec<RecordId>> = Arc::new(
        (0..ops)
            .map(|_| RecordId::new(scope.clone(), IdempotencyKey::random()))
            .collect(),
    );
    let fp = Fingerprint::from_slice(&[7; 32]).expect("fp");
    let body = Arc::new(body);

    // Warm the scripts.
    let warm = RecordId::new(scope.clone(), IdempotencyKey::random());
    let now = SystemClock.now();
    let lease = Duration::from_secs(60);
    let ttl = Duration::from_secs(86_400);
    let req = ClaimRequest::new(
        &warm,
        fp,
        Token::random(),
        now,
        now.plus(lease),
        now.plus(ttl),
    );
    store.claim(&req).await.expect("warm");
    store
        .complete(&warm, req.token, &success(now, &body, ttl))
        .await
        .expect("warm");
    store.claim(&req).await.expect("warm");

    let tokens: Arc<Vec<Token>> = Arc::new((0..ops).map(|_| Token::random()).collect());
    for phase in ["claim (new key)", "complete", "replay"] {
        reset(&mut admin).await;
        let cpu0 = cpu(&mut admin).await;
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (store, ids, body, tokens) = (
                    store.clone(),
                    Arc::clone(&ids),
                    Arc::clone(&body),
                    Arc::clone(&tokens),
                );
                tokio::spawn(async move {
                    for i in (t..ids.len()).step_by(TASKS) {
                        let (id, token) = (&ids[i], tokens[i]);
                        let now = SystemClock.now();
                        if phase == "complete" {
                            let c = success(now, &body, ttl);
                            store.complete(id, token, &c).await.expect("complete");
                            continue;
                        }
                        let req =
                            ClaimRequest::new(id, fp, token, now, now.plus(lease), now.plus(ttl));
                        match (phase, store.claim(&req).await.expect("claim")) {
                            ("replay", ClaimOutcome::Existing(rec)) => {
                                assert_eq!(rec.response.as_deref(), Some(body.as_slice()));
                            }
                            ("claim (new key)", ClaimOutcome::Claimed(_)) => {}
                            (p, other) => panic!("{p}: {other:?}"),
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("join");
        }
        let cpu1 = cpu(&mut admin).await;
        report(phase, ops, &stats(&mut admin).await, cpu1 - cpu0);
    }

    // A last reset marks the end of the measured phases (for a server run
    // under `valgrind --tool=callgrind --dump-before=configResetStatCommand`,
    // which then dumps one profile per phase).
    reset(&mut admin).await;

    // Clean up our keys (never a flush).
    redis_admin::unlink_all(&mut admin, &prefix).await;
}
