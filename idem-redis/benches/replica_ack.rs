//! What [`RedisStore::with_replica_ack`] costs: `Idem::execute` on a fresh
//! key (claim + complete, each followed by `WAIT 1`) and on a replay (no
//! `WAIT`), with and without the option, on a standalone primary with one
//! replica started by the bench on loopback ports 17200-17299 and SIGKILLed
//! at the end (no server is shared, nothing is left behind).
//!
//! Run with `cargo bench -p idem-redis --bench replica_ack` (a short run:
//! 20 samples of 2 s per function); figures are in the crate README.

// The pair of servers and the connection helper are the tests' own (one
// harness for tests and bench, in this crate), not a copy.
#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use idem_core::{Idem, IdempotencyKey, Outcome, Scope};
use idem_redis::RedisStore;
use support::replicated::ReplicatedPair;
use tokio::runtime::Runtime;

type Engine = Arc<Idem<RedisStore>>;

async fn fresh(idem: &Engine, scope: &Scope) {
    let key = IdempotencyKey::random();
    let reply = idem
        .execute(scope, key, &1, |_| async {
            Outcome::<String, String>::Success("x".repeat(256))
        })
        .await
        .expect("fresh");
    assert!(reply.is_stored());
}

async fn replay(idem: &Engine, scope: &Scope, key: &IdempotencyKey) {
    let reply = idem
        .execute(scope, key.clone(), &1, |_| async {
            Outcome::<String, String>::Success(String::new())
        })
        .await
        .expect("replay");
    assert!(reply.is_replay());
}

fn bench(c: &mut Criterion) {
    let pair = ReplicatedPair::start();
    let rt = Runtime::new().expect("runtime");
    let scope = Scope::new("bench", "POST /charges").expect("scope");
    // Every store's connection gets a 10 s response timeout (redis-rs's
    // default is 500 ms), so a slow acknowledgement is answered by `WAIT`'s
    // own timeout, not cut by the client: the same configuration for both
    // columns.
    let connect = |ack: Option<Duration>| {
        let url = pair.url();
        rt.block_on(async move {
            let manager =
                support::manager_with_response_timeout(&url, Duration::from_secs(10)).await;
            let store = RedisStore::new(manager)
                .with_prefix("idem-bench-ack:")
                .expect("prefix");
            let store = match ack {
                Some(timeout) => store.with_replica_ack(1, timeout),
                None => store,
            };
            Arc::new(Idem::new(store))
        })
    };
    let engines: Vec<(&str, Engine)> = vec![
        ("no-wait", connect(None)),
        ("wait-1-replica", connect(Some(Duration::from_secs(1)))),
    ];
    // Warm up before timing: the first acknowledged writes on a replica that
    // has just synchronised (and the scripts' first load) can take longer
    // than the 1 s acknowledgement, so a store with a generous timeout makes
    // them first, then each engine makes a few of its own.
    let warm = connect(Some(Duration::from_secs(30)));
    rt.block_on(async {
        for _ in 0..8 {
            fresh(&warm, &scope).await;
        }
        for (_, idem) in &engines {
            for _ in 0..8 {
                fresh(idem, &scope).await;
            }
        }
    });

    let mut group = c.benchmark_group("replica-ack/fresh");
    for (name, idem) in &engines {
        group.bench_function(*name, |b| b.to_async(&rt).iter(|| fresh(idem, &scope)));
    }
    group.finish();

    let mut group = c.benchmark_group("replica-ack/replay");
    for (name, idem) in &engines {
        let keys: Vec<IdempotencyKey> = (0..256).map(|_| IdempotencyKey::random()).collect();
        rt.block_on(async {
            for key in &keys {
                idem.execute(&scope, key.clone(), &1, |_| async {
                    Outcome::<String, String>::Success("x".repeat(256))
                })
                .await
                .expect("seed");
            }
        });
        let mut i = 0;
        group.bench_function(*name, |b| {
            b.to_async(&rt).iter(|| {
                i = (i + 1) % keys.len();
                replay(idem, &scope, &keys[i])
            });
        });
    }
    group.finish();

    // 8 tasks share the store's one multiplexed connection: Redis holds a
    // client's later commands while its WAIT blocks, so the WAITs of the
    // tasks queue behind one another.
    let mut group = c.benchmark_group("replica-ack/fresh-8-tasks");
    for (name, idem) in &engines {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..8)
                        .map(|t| {
                            let (idem, scope) = (Arc::clone(idem), scope.clone());
                            tokio::spawn(async move {
                                for _ in (t..iters).step_by(8) {
                                    fresh(&idem, &scope).await;
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("task");
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
    drop(pair);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
