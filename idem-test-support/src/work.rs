//! What the backends' scenario tests share: the work they run and count
//! ([`Out`], [`request`], [`Counter`], [`counted`]), and the calls a failover test makes
//! through an engine ([`call`], [`call_held`], [`acknowledged_batch`],
//! [`call_until_answered`], [`state`], [`assert_switch_error`]), generic
//! over the store.

use std::collections::HashMap;
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

/// 96 callers at once on `idem`: 32 fresh keys, 16 keys raced by two
/// callers each, 16 replays and 16 mismatches of keys completed before
/// (stored first, one at a time). Each fresh key's work runs once and is
/// stored; of each raced pair one runs and the other gets 409 or the
/// replay; replays get the stored body; mismatches get 422. The coalescing
/// scenarios of every backend run it on a store that batches its calls.
///
/// # Panics
///
/// When any caller's answer differs from the one it would get alone.
pub async fn mixed_callers<S: Store + 'static>(idem: Engine<S>, scope: Scope) {
    let runs: Vec<Counter> = (0..64).map(|_| Counter::default()).collect();
    let call = |key: String, n: usize, request: serde_json::Value| {
        let (idem, scope, runs) = (Arc::clone(&idem), scope.clone(), runs[n].clone());
        tokio::spawn(async move {
            idem.execute(&scope, key, &request, move |_| async move {
                runs.hit();
                Out::Success(format!("body {n}"))
            })
            .await
        })
    };
    // Keys done-0..16 are stored first, one at a time.
    for i in 0..16 {
        let reply = call(format!("done-{i}"), 48 + i, request())
            .await
            .expect("task")
            .expect("stored");
        assert!(!reply.is_replay());
    }
    let other = serde_json::json!({"amount": 1});
    let mut fresh = Vec::new();
    let mut raced = Vec::new();
    let mut replays = Vec::new();
    let mut mismatches = Vec::new();
    for i in 0..32 {
        fresh.push(call(format!("new-{i}"), i, request()));
    }
    for i in 0..16 {
        raced.push((
            i,
            call(format!("dup-{i}"), 32 + i, request()),
            call(format!("dup-{i}"), 32 + i, request()),
        ));
        replays.push((i, call(format!("done-{i}"), 48 + i, request())));
        mismatches.push(call(format!("done-{i}"), 48 + i, other.clone()));
    }
    for (i, task) in fresh.into_iter().enumerate() {
        let reply = task.await.expect("task").expect("fresh key stored");
        assert!(!reply.is_replay());
        assert_eq!(reply.into_result(), Ok(format!("body {i}")));
        assert_eq!(runs[i].get(), 1, "new-{i} ran once");
    }
    for (i, a, b) in raced {
        let answers = [a.await.expect("task"), b.await.expect("task")];
        let ran = answers
            .iter()
            .filter(|r| matches!(r, Ok(reply) if !reply.is_replay()))
            .count();
        assert_eq!(ran, 1, "dup-{i}: one caller ran it: {answers:?}");
        for r in answers {
            match r {
                Ok(reply) => {
                    assert_eq!(reply.into_result(), Ok(format!("body {}", 32 + i)));
                }
                Err(Error::InFlight { .. }) => {}
                other => panic!("dup-{i}: {other:?}"),
            }
        }
        assert_eq!(runs[32 + i].get(), 1, "dup-{i} ran once");
    }
    for (i, task) in replays {
        let reply = task.await.expect("task").expect("replayed");
        assert!(reply.is_replay());
        assert_eq!(reply.into_result(), Ok(format!("body {}", 48 + i)));
    }
    for task in mismatches {
        let err = task.await.expect("task").expect_err("mismatch");
        assert_eq!(err.code(), "fingerprint_mismatch");
    }
    for i in 0..16 {
        assert_eq!(runs[48 + i].get(), 1, "done-{i} ran once, before");
    }
}

/// The sum of the series of `name` whose labels begin with `call={call}`
/// in what [`recorded_apart`] returned (a histogram counts its samples: for
/// `idem_store_batch_size`, the statements or pipelines sent).
pub fn series(m: &HashMap<String, u64>, name: &str, call: &str) -> u64 {
    m.iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{call={call},")))
        .map(|(_, n)| n)
        .sum()
}

/// Runs `script` with a recording exporter on a thread of its own (so that
/// the test's own runtime is not in the way), and returns what it
/// recorded.
///
/// # Panics
///
/// When the script panics (with its panic).
pub fn recorded_apart<F, Fut>(script: F) -> HashMap<String, u64>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    std::thread::spawn(move || idem_core::testkit::metrics::recorded(script()))
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Whether [`batch_every_call`] was called in this test process.
static BATCH_EVERY_CALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, every store the test support builds (a SQL store on a pool
/// of its own, a standalone Redis store) in this process sends every call
/// through the batched path
/// ([`idem_core::store::Coalescing::Always`]): for a test binary that runs the
/// suite's scenarios that way. A test binary is a process of its own, so
/// the other binaries are not touched.
pub fn batch_every_call() {
    BATCH_EVERY_CALL.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// The variable that asks the same as [`batch_every_call`] for a whole
/// test run (`.ci/run` runs the failover suites once more with it set).
pub const BATCH_EVERY_CALL_VAR: &str = "IDEM_TEST_BATCH_EVERY_CALL";

/// The coalescing mode [`batch_every_call`] (or [`BATCH_EVERY_CALL_VAR`]
/// set to `1`) asked for, if it did: what a dialect's support applies to
/// each store it builds that coalesces.
pub fn forced_coalescing() -> Option<idem_core::store::Coalescing> {
    let asked = BATCH_EVERY_CALL.load(std::sync::atomic::Ordering::SeqCst)
        || std::env::var(BATCH_EVERY_CALL_VAR).is_ok_and(|v| v == "1");
    asked.then_some(idem_core::store::Coalescing::Always)
}
