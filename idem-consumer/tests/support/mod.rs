//! What the broker tests (NATS, RabbitMQ) share: a fixture torn down even
//! when its scenario fails, the billing service's consumer, work that counts
//! its runs, and the checks on what a delivery's handling decided.
#![allow(dead_code, unreachable_pub)]

use std::future::Ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_consumer::{Cause, Consumer, ConsumerBuilder, DeadLetterReason, Disposition, Processed};
use idem_core::store::Store;
use idem_core::{Attempt, Failure, Idem};
use idem_sqlite::SqliteStore;

pub type P = Processed<String, String>;
pub type Out = Result<String, Failure<String>>;

/// A test's broker declarations, deleted at the end even when its scenario
/// fails.
pub use idem_test_support::teardown::{Teardown as Fixture, with_fixture};

/// The billing service's consumer group on `idem`.
pub fn builder<S: Store>(idem: Idem<S>) -> ConsumerBuilder<S> {
    Consumer::builder(idem)
        .owner("billing-service")
        .operation("charge-on-order-created")
}

/// [`builder`] with a retry backoff from `base` (up to `max`), no jitter.
pub fn backing_off<S: Store>(idem: Idem<S>, base: Duration, max: Duration) -> Consumer<S> {
    builder(idem)
        .retry_backoff(base, max)
        .retry_jitter(false)
        .build()
        .expect("consumer")
}

/// The tests' consumer: SQLite in memory, a retry after `base` (up to 5 s).
pub async fn consumer(base: Duration) -> Consumer<SqliteStore> {
    let store = SqliteStore::memory().await.expect("sqlite");
    backing_off(Idem::new(store), base, Duration::from_secs(5))
}

/// A consumer on `idem` that dead-letters permanent failures.
pub fn dead_lettering<S: Store>(idem: Idem<S>) -> Consumer<S> {
    builder(idem)
        .permanent_failure(idem_consumer::ConsumerPermanentFailure::DeadLetter)
        .build()
        .expect("consumer")
}

/// Counts the work's runs, and which of them were recoveries.
#[derive(Clone, Default)]
pub struct Runs {
    runs: Arc<AtomicUsize>,
    recovered: Arc<AtomicUsize>,
}

impl Runs {
    /// Work that counts its run and gives `out`.
    pub fn giving(&self, out: Out) -> impl FnOnce(Attempt) -> Ready<Out> + Send + use<> {
        let this = self.clone();
        move |attempt| {
            this.record(&attempt);
            std::future::ready(out)
        }
    }

    /// Work that counts its run and fails transiently with `error`.
    pub fn transient(&self, error: &str) -> impl FnOnce(Attempt) -> Ready<Out> + Send + use<> {
        self.giving(Err(Failure::transient(error.to_owned())))
    }

    /// Work that counts its run and fails permanently with `error`.
    pub fn permanent(&self, error: &str) -> impl FnOnce(Attempt) -> Ready<Out> + Send + use<> {
        self.giving(Err(Failure::permanent(error.to_owned())))
    }

    /// Counts a run of `attempt`.
    pub fn record(&self, attempt: &Attempt) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if attempt.is_recovery() {
            self.recovered.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Work that counts its run and succeeds with `value`.
    pub fn ok(&self, value: &str) -> impl FnOnce(Attempt) -> Ready<Out> + Send + use<> {
        self.giving(Ok(value.to_owned()))
    }

    /// How many times the work ran.
    pub fn count(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// How many of those runs were recoveries.
    pub fn recovered(&self) -> usize {
        self.recovered.load(Ordering::SeqCst)
    }
}

/// `p` acked, for `cause`.
#[track_caller]
pub fn assert_acked(p: &P, cause: Cause) {
    assert_eq!((p.disposition, p.cause), (Disposition::Ack, cause));
}

/// `p` a replay, acked, of the first run's `first`.
#[track_caller]
pub fn assert_replays(p: P, first: &str) {
    assert_acked(&p, Cause::Replayed);
    assert_eq!(
        p.outcome.map(|o| o.into_result()),
        Some(Ok(first.to_owned()))
    );
}

/// `p` retried after `after`.
#[track_caller]
pub fn assert_retry(p: &P, after: Duration) {
    assert_eq!(p.disposition, Disposition::Retry { after });
}

/// `p` dead-lettered for `reason`.
#[track_caller]
pub fn assert_dead_lettered(p: &P, reason: DeadLetterReason) {
    assert_eq!(p.disposition, Disposition::DeadLetter { reason });
}
