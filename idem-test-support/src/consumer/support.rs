//! Shared pieces of the consumer scenarios.

use std::time::Duration;

use idem_core::clock::ManualClock;
use idem_core::store::{Store, StoreError};
use idem_core::{Idem, IdempotencyKey, Policy};

use idem_consumer::{Consumer, ConsumerBuilder};

pub(crate) use crate::work::{LEASE, RESPONSE_TTL};
pub(crate) const KEY_TTL: Duration = Duration::from_secs(86_400);
/// The backoff base (jitter off): a retry on delivery `n` waits `2^(n-1)` s.
pub(crate) const BASE: Duration = Duration::from_secs(1);

/// The scenarios' policy: lease 60 s, response 1 h, key 1 day.
pub(crate) fn policy() -> Policy {
    crate::work::policy(KEY_TTL, 2, Duration::from_millis(5))
}

/// A builder on `store` with the manual clock, a random consumer group and
/// no jitter.
pub(crate) fn builder<S: Store>(store: S, clock: &ManualClock) -> ConsumerBuilder<S> {
    let idem = Idem::new(store)
        .with_clock(clock.clone())
        .with_policy(policy());
    Consumer::builder(idem)
        .owner(format!("group-{}", IdempotencyKey::random()))
        .operation("charge-on-order-created")
        .retry_backoff(BASE, Duration::from_secs(300))
        .retry_jitter(false)
}

/// The default consumer of the scenarios.
pub(crate) fn consumer<S: Store>(store: S, clock: &ManualClock) -> Consumer<S> {
    builder(store, clock).build().expect("valid consumer")
}

/// A fresh message id.
pub(crate) fn message_id() -> String {
    format!("msg-{}", IdempotencyKey::random())
}

/// A store error a retry cannot fix (a missing table, a permission).
pub(crate) fn backend_error() -> StoreError {
    StoreError::Backend {
        backend: "fault-store",
        source: "relation \"idem_records\" does not exist".into(),
    }
}

/// A record that does not decode.
pub(crate) fn corrupt_error() -> StoreError {
    StoreError::Corrupt {
        backend: "fault-store",
        detail: "unknown state `bogus`".to_owned(),
    }
}
