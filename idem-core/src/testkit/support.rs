//! Shared pieces of the scenarios.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tokio::sync::oneshot;

use crate::clock::{Clock, ManualClock, Timestamp};
use crate::ops::RecordView;
use crate::store::PurgeReport;
use crate::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Completion, Store, StoreError, StoredRecord, Token,
};
use crate::{Attempt, Error, Idem, IdempotencyKey, InFlightMode, Policy, RecordId, Reply, Scope};

/// A charge, the typed success of the scenarios.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The charge id.
    pub id: String,
    /// Its amount.
    pub amount: u64,
}

/// A decline, the typed failure of the scenarios.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decline {
    /// Why.
    pub code: String,
}

crate::storable_as_json!(Charge, Decline);

pub(crate) type Out = crate::Outcome<Charge, Decline>;

pub(crate) const LEASE: Duration = Duration::from_secs(60);
pub(crate) const RESPONSE_TTL: Duration = Duration::from_secs(3600);
pub(crate) const KEY_TTL: Duration = Duration::from_secs(86_400);
pub(crate) const MAX_RESPONSE: usize = 64 * 1024;

pub(crate) fn policy(in_flight: InFlightMode) -> Policy {
    policy_builder(in_flight)
        .build()
        .expect("test policy is valid")
}

/// The test policy's builder, for a scenario that changes one setting.
pub(crate) fn policy_builder(in_flight: InFlightMode) -> crate::PolicyBuilder {
    Policy::builder()
        .lease(LEASE)
        .response_ttl(RESPONSE_TTL)
        .key_ttl(KEY_TTL)
        .max_response_bytes(MAX_RESPONSE)
        .in_flight(in_flight)
        .store_retries(2, Duration::from_millis(5))
}

pub(crate) fn engine<S: Store>(store: &Arc<S>, clock: &ManualClock) -> Idem<Arc<S>> {
    Idem::new(Arc::clone(store))
        .with_clock(clock.clone())
        .with_policy(policy(InFlightMode::Reject))
}

/// A fresh random owner, so scenarios never share records by accident.
pub(crate) fn scope(op: &str) -> Scope {
    Scope::new(format!("tenant-{}", IdempotencyKey::random()), op).expect("valid scope")
}

pub(crate) fn key() -> IdempotencyKey {
    IdempotencyKey::random()
}

pub(crate) fn charge_request(amount: u64) -> serde_json::Value {
    serde_json::json!({"amount": amount, "currency": "eur", "customer": "cus_1"})
}

/// Counts how many times work really ran (clones share the count).
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    /// Counts one run and returns the count after it (1 for the first).
    pub fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    /// The runs counted so far.
    #[must_use]
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

pub(crate) fn record_id(scope: &Scope, key: &IdempotencyKey) -> RecordId {
    RecordId::new(scope.clone(), key.clone())
}

/// What most scenarios start from: a clock at the current time, an engine
/// on `store` in reject mode, a fresh scope for operation `op` and a fresh key.
pub(crate) fn setup<S: Store>(
    store: &Arc<S>,
    op: &str,
) -> (ManualClock, Idem<Arc<S>>, Scope, IdempotencyKey) {
    let clock = ManualClock::starting_now();
    let idem = engine(store, &clock);
    (clock, idem, scope(op), key())
}

/// A successful charge `id` of 100.
pub(crate) fn charge(id: &str) -> Out {
    Out::Success(Charge {
        id: id.into(),
        amount: 100,
    })
}

/// Calls `idem` with the charge request of `amount`, the work answering
/// [`charge`]`(id)` and counting its run in `runs`.
pub(crate) async fn counted_charge<S: Store>(
    idem: &Idem<S>,
    scope: &Scope,
    key: &IdempotencyKey,
    amount: u64,
    id: &str,
    runs: &Counter,
) -> Result<Reply<Charge, Decline>, Error> {
    let (id, runs) = (id.to_owned(), runs.clone());
    charge_with(idem, scope, key, amount, move |_| {
        runs.hit();
        charge(&id)
    })
    .await
}

/// Calls `idem` with the charge request of `amount`, the work answering
/// what `work` makes of its attempt.
async fn charge_with<S: Store>(
    idem: &Idem<S>,
    scope: &Scope,
    key: &IdempotencyKey,
    amount: u64,
    work: impl FnOnce(&Attempt) -> Out + Send,
) -> Result<Reply<Charge, Decline>, Error> {
    idem.execute(
        scope,
        key,
        &charge_request(amount),
        |a| async move { work(&a) },
    )
    .await
}

/// [`counted_charge`] where nobody counts the runs (a replay, or a call
/// refused before the work).
pub(crate) async fn try_charge<S: Store>(
    idem: &Idem<S>,
    scope: &Scope,
    key: &IdempotencyKey,
    amount: u64,
    id: &str,
) -> Result<Reply<Charge, Decline>, Error> {
    counted_charge(idem, scope, key, amount, id, &Counter::default()).await
}

/// A recovery with the charge request of 100 that reconciles: it answers
/// the charge its crashed predecessor saved as the resource id, after
/// `check` looked at its attempt.
pub(crate) async fn reconcile<S: Store>(
    idem: &Idem<S>,
    scope: &Scope,
    key: &IdempotencyKey,
    check: impl FnOnce(&Attempt) + Send,
) -> Result<Reply<Charge, Decline>, Error> {
    charge_with(idem, scope, key, 100, |a| {
        assert!(a.is_recovery());
        check(a);
        let id = a
            .previous_resource_id()
            .expect("saved resource id")
            .to_owned();
        Out::Success(Charge { id, amount: 100 })
    })
    .await
}

/// The operator's view of the record of `scope` and `key` (its body too if
/// `with_body`), `None` when there is none.
pub(crate) async fn inspect<S: Store>(
    idem: &Idem<S>,
    scope: &Scope,
    key: &IdempotencyKey,
    with_body: bool,
) -> Option<RecordView> {
    idem.admin()
        .inspect(scope, key, with_body)
        .await
        .expect("inspect")
}

/// The record of `scope` and `key` as `store` reads it at the clock's now.
pub(crate) async fn fetch<S: Store>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    clock: &ManualClock,
) -> Option<StoredRecord> {
    store
        .fetch(&record_id(scope, key), clock.now())
        .await
        .expect("fetch")
}

/// A claim of `id` under `token` at the clock's now, for the charge request
/// of `amount`, with a lease of `lease` and the test policy's key TTL.
pub(crate) fn claim_req<'a>(
    id: &'a RecordId,
    token: Token,
    clock: &ManualClock,
    amount: u64,
    lease: Duration,
) -> ClaimRequest<'a> {
    let now = clock.now();
    ClaimRequest {
        id,
        fingerprint: crate::adapter::fingerprint(
            "POST /charges",
            &charge_request(amount),
            &crate::FieldFilter::All,
        )
        .expect("fp"),
        token,
        now,
        lease_until: now.plus(lease),
        key_expires_at: now.plus(KEY_TTL),
    }
}

/// A completion at `now` with the test policy's TTLs.
pub(crate) fn completion<'a>(
    now: Timestamp,
    outcome: crate::store::OutcomeKind,
    body: Option<&'a [u8]>,
    resource_id: Option<&'a str>,
) -> Completion<'a> {
    Completion {
        outcome,
        body,
        resource_id,
        now,
        response_expires_at: now.plus(RESPONSE_TTL),
        key_expires_at: now.plus(KEY_TTL),
    }
}

/// Spawns `n` racers that wait for each other and then all start at once,
/// racer `i` running the future `racer(i)` builds: the tasks of a
/// contention test. Their handles, in order.
///
/// # Panics
///
/// When `n` is zero, or outside a Tokio runtime.
pub fn race<T, Fut>(n: usize, racer: impl Fn(usize) -> Fut) -> Vec<tokio::task::JoinHandle<T>>
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    (0..n)
        .map(|i| {
            let (barrier, racer) = (Arc::clone(&barrier), racer(i));
            tokio::spawn(async move {
                barrier.wait().await;
                racer.await
            })
        })
        .collect()
}

/// A first attempt running in a task.
pub(crate) type Running = tokio::task::JoinHandle<Result<Reply<Charge, Decline>, Error>>;

/// Starts a first attempt (the charge request of `amount`) that counts its
/// run, reports its `Attempt` once running and then waits to be told to
/// finish with an outcome. Dropping the sender without sending (or
/// [`crash`]ing the task) leaves the attempt "crashed".
pub(crate) fn start_blocked<S: Store>(
    idem: &Idem<S>,
    scope: &Scope,
    key: &IdempotencyKey,
    amount: u64,
    runs: &Counter,
) -> (Running, oneshot::Receiver<Attempt>, oneshot::Sender<Out>) {
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<Out>();
    let (idem, scope, key, runs) = (idem.clone(), scope.clone(), key.clone(), runs.clone());
    let task = tokio::spawn(async move {
        idem.execute(
            &scope,
            &key,
            &charge_request(amount),
            |attempt| async move {
                runs.hit();
                let _ = started_tx.send(attempt);
                finish_rx.await.unwrap_or(Out::Transient(Decline {
                    code: "abandoned".into(),
                }))
            },
        )
        .await
    });
    (task, started_rx, finish_tx)
}

/// The process running `task` dies: no completion, no release.
pub(crate) async fn crash(task: Running) {
    task.abort();
    let _ = task.await;
}

/// Builds the error an injected fault returns.
type MakeError = fn() -> StoreError;

/// Wraps a store and makes `complete` (and optionally every call) fail with
/// [`StoreError::Unavailable`], to show what the engine does when the store
/// goes down mid-call.
#[derive(Debug)]
pub struct FailingStore<S> {
    inner: Arc<S>,
    faults: Arc<Faults>,
}

/// The faults a [`FailingStore`] injects, shared by its clones.
#[derive(Debug, Default)]
struct Faults {
    fail_complete: AtomicBool,
    fail_all: AtomicBool,
    lose_complete_replies: AtomicUsize,
    claim_error: Mutex<Option<MakeError>>,
}

impl<S> Clone for FailingStore<S> {
    fn clone(&self) -> Self {
        let (inner, faults) = (Arc::clone(&self.inner), Arc::clone(&self.faults));
        Self { inner, faults }
    }
}

impl<S: Store> FailingStore<S> {
    /// A wrapper that passes everything through until told otherwise.
    pub fn new(inner: Arc<S>) -> Self {
        Self {
            inner,
            faults: Arc::default(),
        }
    }
    /// Makes every `claim` fail with the error `make` builds (a store error
    /// a retry cannot fix, a record that does not decode), or pass through
    /// again with `None`.
    pub fn fail_claims_with(&self, make: Option<fn() -> StoreError>) {
        *self
            .faults
            .claim_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = make;
    }
    /// Makes the next `n` completions reach the store and then fail as if
    /// their reply was lost (a timeout after the write).
    pub fn lose_complete_replies(&self, n: usize) {
        self.faults.lose_complete_replies.store(n, Ordering::SeqCst);
    }
    /// Makes `complete` fail (or succeed again).
    pub fn fail_complete(&self, on: bool) {
        self.faults.fail_complete.store(on, Ordering::SeqCst);
    }
    /// Makes every call fail (or succeed again).
    pub fn fail_all(&self, on: bool) {
        self.faults.fail_all.store(on, Ordering::SeqCst);
    }
    /// The faults injected before call `method` reaches the store.
    fn before(&self, method: &str) -> Result<(), StoreError> {
        if self.faults.fail_all.load(Ordering::SeqCst) {
            return Err(injected("injected outage"));
        }
        match method {
            "claim" => {
                let make = *self
                    .faults
                    .claim_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(make) = make {
                    return Err(make());
                }
            }
            "complete" if self.faults.fail_complete.load(Ordering::SeqCst) => {
                return Err(injected("injected completion failure"));
            }
            _ => {}
        }
        Ok(())
    }
    /// The faults injected after call `method` was written by the store.
    fn after(&self, method: &str) -> Result<(), StoreError> {
        let lose = method == "complete"
            && self
                .faults
                .lose_complete_replies
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if lose {
            return Err(injected(
                "injected lost reply after the completion was written",
            ));
        }
        Ok(())
    }
}

/// The error of an injected fault: the store "unavailable".
fn injected(source: &'static str) -> StoreError {
    StoreError::Unavailable {
        backend: "failing-store",
        source: source.into(),
    }
}

/// Every call passes through the injected faults on its way to the wrapped
/// store.
macro_rules! failing_store {
    (
        store { $($m:ident($($p:ident: $t:ty),*) -> $o:ty;)* }
        admin { $($admin:tt)* }
    ) => {
        #[deny(clippy::missing_trait_methods)]
        impl<S: Store> Store for FailingStore<S> {
            $(
                async fn $m(&self, $($p: $t),*) -> Result<$o, StoreError> {
                    self.before(stringify!($m))?;
                    let out = self.inner.$m($($p),*).await?;
                    self.after(stringify!($m))?;
                    Ok(out)
                }
            )*
            fn capabilities(&self) -> Capabilities {
                self.inner.capabilities()
            }
        }
    };
}

crate::store::store_methods!(failing_store {} '_);
