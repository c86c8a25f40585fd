//! What the backends' scenario tests share: the work they run and count
//! ([`Out`], [`request`], [`Counter`], [`counted`]), and the calls a failover test makes
//! through an engine ([`call`], [`call_held`], [`acknowledged_batch`],
//! [`call_until_answered`], [`state`], [`assert_switch_error`]), generic
//! over the store.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{AdminStore, RecordState, Store, StoreError};
use idem_core::{
    Error, Idem, IdempotencyKey, InFlightMode, IntoKey, Outcome, Policy, Reply, Scope,
};
use tokio::sync::{Notify, watch};

/// What the scenarios' works return.
pub type Out = Outcome<String, String>;

/// An engine shared by the tasks of a test.
pub type Engine<S> = Arc<Idem<S>>;

/// The scenarios' lease.
pub const LEASE: Duration = Duration::from_secs(60);
/// The scenarios' response lifetime.
pub const RESPONSE_TTL: Duration = Duration::from_secs(3600);

/// The scenarios' policy: a lease of [`LEASE`], a response kept
/// [`RESPONSE_TTL`] and a key `key_ttl`, a duplicate in flight refused
/// (409), a failed store write tried `retries` more times, `backoff` apart.
///
/// # Panics
///
/// When the values make no valid policy (a test's mistake).
pub fn policy(key_ttl: Duration, retries: u32, backoff: Duration) -> Policy {
    Policy::builder()
        .lease(LEASE)
        .response_ttl(RESPONSE_TTL)
        .key_ttl(key_ttl)
        .in_flight(InFlightMode::Reject)
        .store_retries(retries, backoff)
        .build()
        .expect("a valid test policy")
}

/// The request every scenario sends.
pub fn request() -> serde_json::Value {
    serde_json::json!({"amount": 100, "currency": "eur"})
}

/// How many times a work ran: the conformance kit's counter.
pub use idem_core::testkit::Counter;

/// Calls `key` on `idem` with a work that counts its run in `runs` and
/// answers `answer`; returns what the caller saw.
pub async fn counted<S: Store>(
    idem: &Idem<S>,
    scope: &Scope,
    key: impl IntoKey + Send,
    answer: impl Into<String>,
    runs: &Counter,
) -> Result<Reply<String, String>, Error> {
    let (runs, answer) = (runs.clone(), answer.into());
    idem.execute(scope, key, &request(), |_attempt| async move {
        runs.hit();
        Out::Success(answer)
    })
    .await
}

/// Runs the work for `key` once (counting it) and returns what the caller
/// saw; the work answers `charge for {key}`.
pub async fn call<S: AdminStore>(
    engine: &Engine<S>,
    scope: &Scope,
    key: &str,
    runs: &Counter,
) -> Result<Reply<String, String>, Error> {
    counted(engine, scope, key, format!("charge for {key}"), runs).await
}

/// `n` fresh keys, each executed once; asserts every call was acknowledged
/// as stored (fresh, not a replay). Returns the keys.
///
/// # Panics
///
/// When a call fails or is not reported stored.
pub async fn acknowledged_batch<S: AdminStore>(
    engine: &Engine<S>,
    scope: &Scope,
    runs: &Counter,
    n: usize,
) -> Vec<String> {
    let mut keys = Vec::new();
    for _ in 0..n {
        let key = IdempotencyKey::random().as_str().to_owned();
        let reply = call(engine, scope, &key, runs).await.expect("acknowledged");
        assert!(
            reply.is_stored() && !reply.is_replay(),
            "{key}: stored fresh"
        );
        keys.push(key);
    }
    keys
}

/// A failure seen while the primary is gone: typed, 503, retryable.
///
/// # Panics
///
/// When it is anything else.
pub fn assert_switch_error(e: &Error) {
    assert!(
        matches!(e, Error::Store(StoreError::Unavailable { .. })),
        "{e:?}"
    );
    assert_eq!(e.http_status(), 503, "{e:?}");
    assert!(e.retry_after().is_some(), "{e:?}");
}

/// Calls `key` until the store answers (at most 20 tries), asserting that
/// every retryable failure on the way for which `expected` is false is a
/// typed 503; returns the first answer that is not such a failure.
///
/// # Panics
///
/// When the store never answers.
pub async fn call_until_answered<S: AdminStore>(
    engine: &Engine<S>,
    scope: &Scope,
    key: &str,
    runs: &Counter,
    expected: impl Fn(&Error) -> bool,
) -> Result<Reply<String, String>, Error> {
    for _ in 0..20 {
        match call(engine, scope, key, runs).await {
            Err(e) if !expected(&e) && e.is_retryable() => assert_switch_error(&e),
            other => return other,
        }
    }
    panic!("the promoted server never answered");
}

/// The state and attempt number of `key`'s record, if there is one.
///
/// # Panics
///
/// When the store cannot be read.
pub async fn state<S: AdminStore>(
    engine: &Engine<S>,
    scope: &Scope,
    key: &str,
) -> Option<(RecordState, u32)> {
    engine
        .admin()
        .inspect(scope, key, true)
        .await
        .expect("inspect")
        .map(|r| (r.state, r.attempt))
}

/// Starts a call whose work waits for `go` (after counting itself); returns
/// once the work runs, i.e. once the claim is done.
///
/// # Panics
///
/// When the work does not start within 30 seconds.
pub async fn call_held<S: AdminStore + 'static>(
    engine: &Engine<S>,
    scope: &Scope,
    key: &str,
    runs: &Counter,
    go: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<Reply<String, String>, Error>> {
    let started = Arc::new(Notify::new());
    let (engine, scope, key, runs, go, s) = (
        Arc::clone(engine),
        scope.clone(),
        key.to_owned(),
        runs.clone(),
        go.clone(),
        Arc::clone(&started),
    );
    let task = tokio::spawn(async move {
        let body = format!("charge for {key}");
        engine
            .execute(&scope, key.as_str(), &request(), |_attempt| async move {
                runs.hit();
                s.notify_one();
                let mut go = go;
                let _ = go.wait_for(|&open| open).await;
                Out::Success(body)
            })
            .await
    });
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("the work started");
    task
}

/// What two calls left waiting at a failover were told once the primary
/// was gone: `claim` (a fresh claim whose commit never returned) failed
/// with a switch error and ran no work; `held` (a call whose work ran and
/// whose completion's commit never returned) got its outcome, not stored.
///
/// # Panics
///
/// When either was told anything else.
pub async fn assert_waiting_calls_never_stored(
    claim: tokio::task::JoinHandle<Result<Reply<String, String>, Error>>,
    claim_runs: &Counter,
    held: tokio::task::JoinHandle<Result<Reply<String, String>, Error>>,
    held_runs: &Counter,
) {
    let claim = claim
        .await
        .expect("join")
        .expect_err("the claim never committed");
    assert_switch_error(&claim);
    assert_eq!(claim_runs.get(), 0, "no work without a committed claim");
    let held = held.await.expect("join").expect("the work's outcome");
    assert!(!held.is_stored(), "the completion's commit never returned");
    assert_eq!(held_runs.get(), 1);
}
