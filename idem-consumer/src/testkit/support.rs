//! Shared pieces of the consumer scenarios.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::clock::{ManualClock, Timestamp};
use idem_core::ops::PurgeReport;
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Completion, Store, StoreError, StoredRecord, Token,
};
use idem_core::{Idem, IdempotencyKey, InFlightMode, Policy, RecordId};

use crate::{Consumer, ConsumerBuilder};

pub(crate) const LEASE: Duration = Duration::from_secs(60);
pub(crate) const RESPONSE_TTL: Duration = Duration::from_secs(3600);
pub(crate) const KEY_TTL: Duration = Duration::from_secs(86_400);
/// The backoff base (jitter off): a retry on delivery `n` waits `2^(n-1)` s.
pub(crate) const BASE: Duration = Duration::from_secs(1);

/// The scenarios' policy: lease 60 s, response 1 h, key 1 day.
pub(crate) fn policy() -> Policy {
    Policy::builder()
        .lease(LEASE)
        .response_ttl(RESPONSE_TTL)
        .key_ttl(KEY_TTL)
        .in_flight(InFlightMode::Reject)
        .store_retries(2, Duration::from_millis(5))
        .build()
        .expect("test policy is valid")
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

/// Counts how many times work really ran.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub(crate) fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Which fault a [`FaultStore`] injects into `claim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// A store error a retry cannot fix (a missing table, a permission).
    Backend,
    /// A record that does not decode.
    Corrupt,
}

/// Wraps a real store and makes its claims fail with a non-retryable error
/// (C15), forwarding everything else.
#[derive(Debug, Clone)]
pub(crate) struct FaultStore<S> {
    inner: S,
    backend: Arc<AtomicBool>,
    corrupt: Arc<AtomicBool>,
}

impl<S: Store> FaultStore<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            backend: Arc::default(),
            corrupt: Arc::default(),
        }
    }
    pub(crate) fn inject(&self, fault: Fault) {
        self.backend
            .store(fault == Fault::Backend, Ordering::SeqCst);
        self.corrupt
            .store(fault == Fault::Corrupt, Ordering::SeqCst);
    }
}

#[deny(clippy::missing_trait_methods)]
impl<S: Store> Store for FaultStore<S> {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        if self.backend.load(Ordering::SeqCst) {
            return Err(StoreError::Backend {
                backend: "fault-store",
                source: "relation \"idem_records\" does not exist".into(),
            });
        }
        if self.corrupt.load(Ordering::SeqCst) {
            return Err(StoreError::Corrupt {
                backend: "fault-store",
                detail: "unknown state `bogus`".to_owned(),
            });
        }
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        self.inner.complete(id, token, c).await
    }
    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        self.inner.release(id, token, now).await
    }
    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.inner.save_resource_id(id, token, resource_id).await
    }
    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        until: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner.extend_lease(id, token, until).await
    }
    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        self.inner.fetch(id, now).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        self.inner.purge_expired(now, limit).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
