//! The queue consumer's `Consumer::process` against the dedup table people
//! write by hand (`common::dedup`: `INSERT … ON CONFLICT DO NOTHING` on
//! `(provider, event_id)`, or Redis `SET NX`, then the work), on the same
//! store, in the same run, one message at a time:
//!
//! * **first delivery**: a new message id (idem: claim, the work, the
//!   stored outcome; by hand: the insert, the work);
//! * **redelivery**: one of 256 messages already processed (idem: the
//!   claim answers with the stored outcome, a replay; by hand: an insert
//!   that inserts nothing).
//!
//! The message is a 160-byte JSON order (idem fingerprints it); the work is
//! a no-op; both sides count their runs, and the bench checks each first
//! delivery ran it once and no redelivery ran it.
//!
//! Backends as in the other benches: a SQLite file (`SqliteStore::open`),
//! Postgres (`IDEM_POSTGRES_URL`, schema `idem_bench_consumer_<pid>`,
//! dropped at the end) and Redis (`IDEM_REDIS_URL`, prefix
//! `idem-bench-consumer-<pid>:`, its keys deleted at the end); an
//! unreachable server is reported and its groups are not run.
//!
//! Run with: `cargo bench --bench consumer --all-features` (pinned:
//! `taskset -c 1 cargo bench …`; `IDEM_BENCH_QUICK=1` for a smoke run).

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::dedup::{Dedup, sample};
use criterion::Criterion;
use idem::consumer::{Cause, Consumer};
use idem::store::Store;
use idem::{Failure, Idem};
use tokio::runtime::Runtime;

/// The consumer group, and the provider column of the hand-written table.
const GROUP: &str = "billing-service";
/// Messages delivered again in the redelivery scenario.
const STORED: u64 = 256;

fn message(id: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","type":"order.created","order":{{"sku":"book-0042","qty":1,"total_cents":2599,"currency":"EUR"}}}}"#
    )
    .into_bytes()
}

/// A message id; `run` keeps each bench's ids apart.
fn id(run: &str, n: u64) -> String {
    format!("msg_{run}_{n:012}")
}

/// Both sides on one backend.
struct Sides<S: Store> {
    consumer: Consumer<S>,
    dedup: Dedup,
    runs: Arc<AtomicU64>,
    next: AtomicU64,
}

impl<S: Store> Sides<S> {
    fn new(store: S, dedup: Dedup) -> Self {
        let policy = common::stores::policy();
        let consumer = Consumer::builder(Idem::new(store).with_policy(policy))
            .owner(GROUP)
            .operation("charge")
            .build()
            .expect("consumer");
        Self {
            consumer,
            dedup,
            runs: Arc::default(),
            next: AtomicU64::new(0),
        }
    }

    /// One delivery through idem; `true` when the work ran.
    async fn idem(&self, id: &str) -> bool {
        let runs = Arc::clone(&self.runs);
        let p = self
            .consumer
            .process(id, &message(id), move |_| async move {
                runs.fetch_add(1, Ordering::Relaxed);
                Ok::<_, Failure<String>>("charged".to_owned())
            })
            .await;
        assert!(p.disposition.is_ack(), "{p:?}");
        p.cause == Cause::Succeeded
    }

    /// One delivery through the hand-written table; `true` when the work
    /// ran.
    async fn by_hand(&self, id: &str) -> bool {
        let payload = message(id);
        if self.dedup.first_time(GROUP, id).await {
            self.runs.fetch_add(1, Ordering::Relaxed);
            std::hint::black_box(payload);
            true
        } else {
            false
        }
    }

    async fn side(&self, hand: bool, id: &str) -> bool {
        if hand {
            self.by_hand(id).await
        } else {
            self.idem(id).await
        }
    }
}

fn bench_backend<S: Store>(c: &mut Criterion, rt: &Runtime, backend: &str, sides: &Sides<S>) {
    let tag = format!("{}", std::process::id());
    // The stored messages of the redelivery scenario, on both sides.
    rt.block_on(async {
        for n in 0..STORED {
            assert!(sides.idem(&id(&format!("{tag}i"), n)).await);
            assert!(sides.by_hand(&id(&format!("{tag}h"), n)).await);
        }
    });
    // First deliveries (a fresh message each: the work runs every time),
    // then redeliveries of the stored messages (the work never runs).
    for (group, fresh) in [("first-delivery", true), ("redelivery", false)] {
        let mut g = c.benchmark_group(format!("consumer/{backend}/{group}"));
        for (name, hand) in [("idem process", false), ("dedup table", true)] {
            let side = if hand { "h" } else { "i" };
            let run = format!("{tag}{side}{}", if fresh { "f" } else { "" });
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let ran = if fresh { iters } else { 0 };
                    sample(rt, &sides.runs, ran, async {
                        for i in 0..iters {
                            let n = if fresh {
                                sides.next.fetch_add(1, Ordering::Relaxed)
                            } else {
                                i % STORED
                            };
                            let message = id(&run, n);
                            assert_eq!(sides.side(hand, &message).await, fresh, "{message}");
                        }
                    })
                });
            });
        }
        g.finish();
    }
}

/// [`bench_backend`] on each backend.
struct Bench;

impl common::dedup::OnBackend for Bench {
    fn on<S: Store>(c: &mut Criterion, rt: &Runtime, backend: &str, store: S, dedup: Dedup) {
        bench_backend(c, rt, backend, &Sides::new(store, dedup));
    }
}

fn main() {
    common::dedup::main::<Bench>("consumer");
}
