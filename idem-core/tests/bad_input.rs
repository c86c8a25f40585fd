//! One named case per row of the bad-input table in `idem-core/README.md`:
//! every input a caller or a corrupted store can produce, the typed error,
//! its HTTP status, and whether the work ran.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock, Timestamp};
use idem_core::error::{KeyError, PolicyError, RequestError, ScopeError};
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Completion, Store, StoreError, StoredRecord, Token,
};
use idem_core::store::{OutcomeKind, PurgeReport, RecordState};
use idem_core::{
    Error, FieldFilter, HttpResponse, Idem, IdempotencyKey, InFlightMode, Json, MemoryStore,
    Outcome, Policy, RawJson, RecordId, Reply, Scope,
};
use serde_json::{Value, json};

/// Counts how many times the work really ran.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

type Out = Outcome<Value, String>;

fn scope() -> Scope {
    Scope::new("acct_1", "POST /charges").expect("scope")
}

fn engine() -> Idem<MemoryStore> {
    Idem::new(MemoryStore::new()).with_clock(ManualClock::starting_now())
}

/// Runs `execute` with a counting work that succeeds with `{"ok": true}`.
async fn call<S: Store, R: serde::Serialize + Sync + ?Sized>(
    idem: &Idem<S>,
    key: &str,
    request: &R,
    runs: &Runs,
) -> Result<Value, Error> {
    let r = runs.clone();
    idem.execute(&scope(), key, request, |_| async move {
        r.hit();
        Out::Success(json!({"ok": true}))
    })
    .await
    .map(|reply| reply.into_result().expect("success"))
}

/// Calls "k" with the empty request and a work that counts its run in
/// `runs` and answers `value`.
async fn answering<S: Store, T: idem_core::Storable + Send, E: idem_core::Storable>(
    idem: &Idem<S>,
    value: T,
    runs: &Runs,
) -> Result<Reply<T, E>, Error> {
    let r = runs.clone();
    idem.execute(&scope(), "k", &json!({}), |_| async move {
        r.hit();
        Outcome::<T, E>::Success(value)
    })
    .await
}

/// Asserts the call is refused with `status`, the work did not run, and
/// nothing was stored under the key.
async fn refused<R: serde::Serialize + Sync + ?Sized>(
    key: &str,
    request: &R,
    status: u16,
) -> Error {
    let idem = engine();
    let runs = Runs::default();
    let err = call(&idem, key, request, &runs).await.expect_err("refused");
    assert_eq!(err.http_status(), status, "{err:?}");
    assert_eq!(runs.get(), 0, "the work ran for a refused input");
    assert!(idem.store().is_empty(), "something was stored for {err:?}");
    err
}

/// [`refused`] for a request refused as invalid (400) under key `k`: why.
async fn invalid_request<R: serde::Serialize + Sync + ?Sized>(request: &R) -> RequestError {
    match refused("k", request, 400).await {
        Error::InvalidRequest(why) => why,
        other => panic!("not an invalid request: {other:?}"),
    }
}

fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = json!([v]);
    }
    v
}

fn nested_raw(depth: usize) -> String {
    "[".repeat(depth) + "1" + &"]".repeat(depth)
}

// ---------------------------------------------------------------- keys

/// Keys refused before the store is touched: each with the reason it must
/// be refused for.
#[tokio::test]
async fn invalid_keys_are_refused() {
    let too_long = "k".repeat(256);
    type Case<'a> = (&'a str, fn(&KeyError) -> bool);
    let cases: [Case<'_>; 5] = [
        ("", |e| matches!(e, KeyError::Empty)),
        (" \t ", |e| matches!(e, KeyError::Empty)),
        (&too_long, |e| matches!(e, KeyError::TooLong { len: 256 })),
        ("clé", |e| matches!(e, KeyError::InvalidCharacter { .. })),
        ("a\nb", |e| matches!(e, KeyError::InvalidCharacter { .. })),
    ];
    for (raw, expected) in cases {
        let err = refused(raw, &json!({}), 400).await;
        assert!(
            matches!(&err, Error::InvalidKey(e) if expected(e)),
            "{raw:?}: {err:?}"
        );
    }
}

#[tokio::test]
async fn key_unicode_whitespace_around() {
    for raw in ["\u{a0}k1", "k1\u{a0}", "\u{2003}k1", "\nk1", "k1\r\n"] {
        let err = refused(raw, &json!({}), 400).await;
        assert!(
            matches!(err, Error::InvalidKey(KeyError::InvalidCharacter { .. })),
            "{raw:?}: {err:?}"
        );
    }
    // ASCII spaces and tabs are trimmed: the same key as `k1`.
    let idem = engine();
    let runs = Runs::default();
    call(&idem, "k1", &json!({}), &runs).await.expect("first");
    call(&idem, " \tk1\t ", &json!({}), &runs)
        .await
        .expect("replay");
    assert_eq!(runs.get(), 1);
}

// ---------------------------------------------------------------- scope

/// Scopes refused when built: each with the reason it must be refused for,
/// and a 400 as the engine's error.
#[test]
fn invalid_scopes_are_refused() {
    let too_long = "o".repeat(1025);
    type Case<'a> = (&'a str, &'a str, fn(&ScopeError) -> bool);
    let cases: [Case<'_>; 3] = [
        ("", "POST /x", |e| matches!(e, ScopeError::Empty { .. })),
        (&too_long, "POST /x", |e| {
            matches!(e, ScopeError::TooLong { .. })
        }),
        ("acct", "POST /x\n", |e| {
            matches!(e, ScopeError::ControlCharacter { .. })
        }),
    ];
    for (owner, operation, expected) in cases {
        let err: Error = Scope::new(owner, operation).expect_err("refused").into();
        assert!(
            matches!(&err, Error::InvalidScope(e) if expected(e)),
            "{operation:?}: {err:?}"
        );
        assert_eq!(err.http_status(), 400);
    }
}

// ---------------------------------------------------------------- requests

#[tokio::test]
async fn request_not_json() {
    let why = invalid_request(&RawJson(b"{\"a\":")).await;
    assert!(matches!(why, RequestError::NotJson(_)), "{why:?}");
}

#[tokio::test]
async fn request_map_with_non_string_keys() {
    let mut m = BTreeMap::new();
    m.insert((1u8, 2u8), 3u8);
    let why = invalid_request(&m).await;
    assert!(matches!(why, RequestError::NotJson(_)), "{why:?}");
}

#[tokio::test]
async fn request_duplicate_member_name() {
    let why = invalid_request(&RawJson(br#"{"amount":1,"amount":1000}"#)).await;
    assert!(matches!(why, RequestError::DuplicateMember), "{why:?}");
    let nested = br#"{"a":[{"x":1,"y":2,"x":3}]}"#;
    let why = invalid_request(&RawJson(nested)).await;
    assert!(matches!(why, RequestError::DuplicateMember), "{why:?}");
}

#[tokio::test]
async fn request_non_finite_number() {
    #[derive(serde::Serialize)]
    struct Charge {
        amount: Option<f64>,
    }
    for amount in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let why = invalid_request(&Charge {
            amount: Some(amount),
        })
        .await;
        assert!(
            matches!(why, RequestError::NonFiniteNumber),
            "{amount}: {why:?}"
        );
    }
    let why = invalid_request(&vec![1.0_f32, f32::NAN]).await;
    assert!(matches!(why, RequestError::NonFiniteNumber), "{why:?}");
    // `None` is a request of its own (null), never equal to a NaN.
    assert!(fingerprint("op", &Charge { amount: None }, &FieldFilter::All).is_ok());
}

#[tokio::test]
async fn request_too_deep_value() {
    let idem = engine();
    let runs = Runs::default();
    call(
        &idem,
        "k",
        &nested(idem_core::adapter::MAX_REQUEST_DEPTH),
        &runs,
    )
    .await
    .expect("the limit itself is accepted");
    let why = invalid_request(&nested(idem_core::adapter::MAX_REQUEST_DEPTH + 1)).await;
    assert!(matches!(why, RequestError::TooDeep), "{why:?}");
}

#[tokio::test]
async fn request_too_deep_raw_json() {
    let idem = engine();
    let runs = Runs::default();
    let ok = nested_raw(idem_core::adapter::MAX_REQUEST_DEPTH);
    call(&idem, "k", &RawJson(ok.as_bytes()), &runs)
        .await
        .expect("the limit itself is accepted, as for a Value");
    // The same request as a Value and as raw JSON: one fingerprint.
    call(
        &idem,
        "k",
        &nested(idem_core::adapter::MAX_REQUEST_DEPTH),
        &runs,
    )
    .await
    .expect("replay");
    assert_eq!(runs.get(), 1);
    let deep = nested_raw(idem_core::adapter::MAX_REQUEST_DEPTH + 1);
    let why = invalid_request(&RawJson(deep.as_bytes())).await;
    assert!(matches!(why, RequestError::TooDeep), "{why:?}");
    let hostile = nested_raw(100_000);
    let why = invalid_request(&RawJson(hostile.as_bytes())).await;
    assert!(matches!(why, RequestError::TooDeep), "{why:?}");
}

#[tokio::test]
async fn request_same_key_other_request() {
    let idem = engine();
    let runs = Runs::default();
    call(&idem, "k", &json!({"amount": 1}), &runs)
        .await
        .expect("first");
    let err = call(&idem, "k", &json!({"amount": 2}), &runs)
        .await
        .expect_err("mismatch");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    assert_eq!(err.http_status(), 422);
    assert_eq!(runs.get(), 1);
}

#[tokio::test]
async fn request_integers_differing_beyond_2_pow_53() {
    let idem = engine();
    let runs = Runs::default();
    let a = RawJson(br#"{"to_account": 9007199254740993}"#);
    let b = RawJson(br#"{"to_account": 9007199254740992}"#);
    call(&idem, "k", &a, &runs).await.expect("first");
    let err = call(&idem, "k", &b, &runs)
        .await
        .expect_err("other account");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    assert_eq!(err.http_status(), 422);
    call(
        &idem,
        "k",
        &json!({"to_account": 9_007_199_254_740_993_u64}),
        &runs,
    )
    .await
    .expect("the same integer as a Value replays");
    assert_eq!(runs.get(), 1);
    let (min, min1) = (json!({"n": i64::MIN}), json!({"n": i64::MIN + 1}));
    assert_ne!(
        fingerprint("op", &min, &FieldFilter::All).expect("valid"),
        fingerprint("op", &min1, &FieldFilter::All).expect("valid")
    );
}

// ---------------------------------------------------------------- policy

fn policy_err(b: idem_core::PolicyBuilder) -> PolicyError {
    b.build().expect_err("refused at build")
}

#[test]
fn policy_duration_under_a_millisecond() {
    let e = policy_err(Policy::builder().response_ttl(Duration::from_micros(10)));
    assert_eq!(
        e,
        PolicyError::TooShort {
            setting: "response_ttl"
        }
    );
}

#[test]
fn policy_duration_over_the_limit() {
    let e = policy_err(Policy::builder().in_flight(InFlightMode::Wait {
        timeout: Duration::MAX,
        poll: Duration::from_millis(50),
    }));
    assert_eq!(
        e,
        PolicyError::TooLong {
            setting: "wait timeout"
        }
    );
}

#[test]
fn policy_key_ttl_below_response_ttl() {
    let e = policy_err(
        Policy::builder()
            .response_ttl(Duration::from_secs(10))
            .key_ttl(Duration::from_secs(5))
            .lease(Duration::from_secs(1)),
    );
    assert_eq!(e, PolicyError::KeyTtlBelowResponseTtl);
}

#[test]
fn policy_lease_not_below_key_ttl() {
    let s = Duration::from_secs(10);
    let e = policy_err(Policy::builder().response_ttl(s).key_ttl(s).lease(s));
    assert_eq!(e, PolicyError::LeaseNotBelowKeyTtl);
}

#[test]
fn policy_response_limit() {
    let e = policy_err(Policy::builder().max_response_bytes(257 << 20));
    assert_eq!(e, PolicyError::ResponseLimit { bytes: 257 << 20 });
}

#[test]
fn policy_no_store_tries() {
    let e = policy_err(Policy::builder().store_retries(0, Duration::ZERO));
    assert_eq!(e, PolicyError::NoStoreTries);
}

#[test]
fn policy_pointer_not_rfc6901() {
    let e = policy_err(Policy::builder().fields(FieldFilter::only(["amount"])));
    assert!(matches!(e, PolicyError::InvalidPointer { .. }), "{e:?}");
}

#[test]
fn policy_pointer_non_canonical_index() {
    for p in ["/items/01", "/items/+1"] {
        let e = policy_err(Policy::builder().fields(FieldFilter::ignore([p])));
        assert!(
            matches!(e, PolicyError::InvalidPointer { .. }),
            "{p}: {e:?}"
        );
    }
}

/// The longest accepted durations build, and `execute` computes its
/// deadlines without overflowing; `extend_lease` takes any duration.
#[tokio::test]
async fn policy_longest_durations_execute() {
    let policy = Policy::builder()
        .in_flight(InFlightMode::Wait {
            timeout: Policy::MAX_DURATION,
            poll: Policy::MAX_DURATION,
        })
        .build()
        .expect("the longest accepted durations build");
    let idem = engine().with_policy(policy);
    let runs = Runs::default();
    let r = runs.clone();
    let reply = idem
        .execute(&scope(), "k1", &json!({"a": 1}), |a| async move {
            r.hit();
            a.extend_lease(Duration::MAX)
                .await
                .expect("extend by anything");
            Outcome::<u32, u32>::Success(1)
        })
        .await
        .expect("executes");
    assert_eq!(reply.into_result(), Ok(1));
    assert_eq!(runs.get(), 1);
}

/// Any `Duration` in a `PurgerConfig` works: the purger does not panic on its
/// first pause (it used to overflow adding `jitter` to `interval`), keeps
/// running, and stops when asked.
#[tokio::test]
async fn purger_any_durations() {
    for (interval, jitter, timeout) in [
        (Duration::MAX, Duration::MAX, Duration::MAX),
        (Duration::ZERO, Duration::MAX, Duration::ZERO),
        (Duration::MAX, Duration::ZERO, Duration::from_nanos(1)),
    ] {
        let purger = engine().spawn_purger(idem_core::ops::PurgerConfig {
            interval,
            batch: 10,
            jitter,
            timeout,
        });
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(
            purger.is_running(),
            "the purger died on interval {interval:?}, jitter {jitter:?}"
        );
        assert_eq!(purger.stop().await, PurgeReport::default());
    }
}

// ---------------------------------------------------------------- responses

/// Asserts the first call returns the work's outcome marked not stored, and
/// every retry gets 409 `ResponseNotStored` without running the work.
async fn not_stored<T>(value: T)
where
    T: idem_core::Storable + Clone + Sync + std::fmt::Debug,
{
    let idem = engine();
    let runs = Runs::default();
    let first = answering::<_, _, String>(&idem, value.clone(), &runs)
        .await
        .expect("the caller gets the work's outcome");
    assert!(!first.is_stored());
    for _ in 0..2 {
        let err = answering::<_, _, String>(&idem, value.clone(), &runs)
            .await
            .expect_err("not stored");
        assert!(matches!(err, Error::ResponseNotStored { .. }), "{err:?}");
        assert_eq!(err.http_status(), 409);
    }
    assert_eq!(runs.get(), 1);
}

#[tokio::test]
async fn response_non_finite_float() {
    not_stored(Json(f64::NAN)).await;
    not_stored(Json(vec![1.0_f32, f32::INFINITY])).await;
}

#[tokio::test]
async fn response_too_deep() {
    not_stored(nested(200)).await;
    not_stored(nested(idem_core::adapter::MAX_REQUEST_DEPTH + 1)).await;
}

#[tokio::test]
async fn response_not_serializable() {
    let mut m = BTreeMap::new();
    m.insert(vec![1u8], 1u8);
    not_stored(Json(m)).await;
}

#[tokio::test]
async fn response_larger_than_the_limit() {
    not_stored("x".repeat((1 << 20) + 1)).await;
}

#[tokio::test]
async fn response_at_the_depth_limit_replays() {
    let idem = engine();
    let runs = Runs::default();
    for _ in 0..2 {
        let deepest = nested(idem_core::adapter::MAX_REQUEST_DEPTH);
        let reply = answering::<_, _, String>(&idem, deepest, &runs)
            .await
            .expect("stored and replayed");
        assert_eq!(
            reply.into_result().expect("valid"),
            nested(idem_core::adapter::MAX_REQUEST_DEPTH)
        );
    }
    assert_eq!(runs.get(), 1);
}

// ---------------------------------------------------------------- stored records

/// Writes a completed record with `body` under "k" through the Store API.
async fn store_body(store: &MemoryStore, clock: &ManualClock, body: &[u8]) {
    let id = RecordId::new(scope(), IdempotencyKey::parse("k").expect("valid"));
    let now = clock.now();
    let token = Token::random();
    let req = ClaimRequest::new(
        &id,
        fingerprint("POST /charges", &json!({}), &FieldFilter::All).expect("valid"),
        token,
        now,
        now.plus(Duration::from_secs(60)),
        now.plus(Duration::from_secs(3600)),
    );
    store.claim(&req).await.expect("claim");
    let c = Completion::new(
        OutcomeKind::Success,
        Some(body),
        None,
        now,
        now.plus(Duration::from_secs(60)),
        now.plus(Duration::from_secs(3600)),
    );
    store.complete(&id, token, &c).await.expect("complete");
}

/// An engine on a store holding a completed record with `body` under "k".
async fn engine_over(body: &[u8]) -> Idem<MemoryStore> {
    let (store, clock) = (MemoryStore::new(), ManualClock::starting_now());
    store_body(&store, &clock, body).await;
    Idem::new(store).with_clock(clock)
}

/// Asserts a call was refused as a corrupt record (500), the work not run.
fn assert_corrupt(err: &Error, runs: &Runs) {
    assert!(matches!(err, Error::CorruptRecord { .. }), "{err:?}");
    assert_eq!(err.http_status(), 500);
    assert_eq!(runs.get(), 0);
}

#[tokio::test]
async fn stored_body_not_decodable() {
    let idem = engine_over(b"{nope").await;
    let runs = Runs::default();
    let err = call(&idem, "k", &json!({}), &runs)
        .await
        .expect_err("corrupt");
    assert_corrupt(&err, &runs);
}

#[tokio::test]
async fn stored_http_response_malformed() {
    let idem = engine_over(b"IDH1\x00\xc8\xff\xff\xff\xff").await;
    let runs = Runs::default();
    let ok = HttpResponse::new(200, vec![], vec![]);
    let err = answering::<_, _, HttpResponse>(&idem, ok, &runs)
        .await
        .expect_err("corrupt");
    assert_corrupt(&err, &runs);
}

// ---------------------------------------------------------------- store replies

/// A store that answers every claim with `claim` and every write with
/// `write`, to play a corrupted or failing backend.
#[derive(Debug)]
struct Canned {
    claim: ClaimReply,
    write: fn() -> Result<(), StoreError>,
}

impl Store for Canned {
    async fn claim(&self, _: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        (self.claim)()
    }
    async fn complete(&self, _: &RecordId, _: Token, _: &Completion<'_>) -> Result<(), StoreError> {
        (self.write)()
    }
    async fn release(&self, _: &RecordId, _: Token, _: Timestamp) -> Result<(), StoreError> {
        (self.write)()
    }
    async fn save_resource_id(&self, _: &RecordId, _: Token, _: &str) -> Result<(), StoreError> {
        (self.write)()
    }
    async fn extend_lease(&self, _: &RecordId, _: Token, _: Timestamp) -> Result<(), StoreError> {
        (self.write)()
    }
    async fn fetch(&self, _: &RecordId, _: Timestamp) -> Result<Option<StoredRecord>, StoreError> {
        Ok(None)
    }
    async fn purge_expired(&self, _: Timestamp, _: u32) -> Result<PurgeReport, StoreError> {
        Ok(PurgeReport::default())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

fn record(state: RecordState, outcome: Option<OutcomeKind>, lease_until: i64) -> StoredRecord {
    StoredRecord {
        fingerprint: fingerprint("POST /charges", &json!({}), &FieldFilter::All).expect("valid"),
        state,
        attempt: 1,
        lease_until: Timestamp::from_unix_millis(lease_until),
        resource_id: None,
        outcome,
        response: None,
        response_expires_at: None,
        key_expires_at: Timestamp::from_unix_millis(i64::MAX),
    }
}

fn ok() -> Result<(), StoreError> {
    Ok(())
}

async fn with_store(store: Canned) -> (Result<Value, Error>, usize) {
    let idem = Idem::new(store).with_clock(ManualClock::starting_now());
    let runs = Runs::default();
    (call(&idem, "k", &json!({}), &runs).await, runs.get())
}

/// A store's answer to a claim.
type ClaimReply = fn() -> Result<ClaimOutcome, StoreError>;

/// Store replies the engine must refuse: each case's claim and write
/// replies, what the error must be, its status, and how often the work ran.
#[tokio::test]
async fn store_replies_are_refused() {
    type Case = (
        &'static str,
        ClaimReply,
        fn() -> Result<(), StoreError>,
        fn(&Error) -> bool,
        u16,
        usize,
    );
    let cases: [Case; 4] = [
        (
            "completed without outcome",
            || {
                Ok(ClaimOutcome::Existing(record(
                    RecordState::Completed,
                    None,
                    0,
                )))
            },
            ok,
            |e| matches!(e, Error::CorruptRecord { .. }),
            500,
            0,
        ),
        (
            "corrupt",
            || {
                Err(StoreError::Corrupt {
                    backend: "canned",
                    detail: "unknown state".into(),
                })
            },
            ok,
            |e| matches!(e, Error::CorruptRecord { .. }),
            500,
            0,
        ),
        (
            "unavailable",
            || {
                Err(StoreError::Unavailable {
                    backend: "canned",
                    source: "connection refused".into(),
                })
            },
            ok,
            |e| matches!(e, Error::Store(_)) && e.retry_after() == Some(Duration::from_secs(1)),
            503,
            0,
        ),
        (
            "lease lost on completion",
            || {
                Ok(ClaimOutcome::Claimed(idem_core::store::Claimed {
                    attempt: 1,
                    previous: None,
                }))
            },
            || Err(StoreError::LeaseLost),
            |e| matches!(e, Error::LeaseLost { .. }),
            409,
            1,
        ),
    ];
    for (case, claim, write, expected, status, ran) in cases {
        let (res, runs) = with_store(Canned { claim, write }).await;
        let err = res.expect_err(case);
        assert!(expected(&err), "{case}: {err:?}");
        assert_eq!((err.http_status(), runs), (status, ran), "{case}");
    }
}

#[tokio::test]
async fn store_reply_extreme_timestamps() {
    let claims: [ClaimReply; 3] = [
        || {
            Ok(ClaimOutcome::Existing(record(
                RecordState::InFlight,
                None,
                i64::MAX,
            )))
        },
        || {
            Ok(ClaimOutcome::Existing(record(
                RecordState::InFlight,
                None,
                i64::MIN,
            )))
        },
        || {
            Ok(ClaimOutcome::Existing(record(
                RecordState::Released,
                None,
                0,
            )))
        },
    ];
    for claim in claims {
        let (res, runs) = with_store(Canned { claim, write: ok }).await;
        let err = res.expect_err("in flight");
        assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
        assert_eq!((err.http_status(), runs), (409, 0));
        let retry = err.retry_after().expect("retry-after");
        assert!(retry >= Duration::from_secs(1));
    }
}

#[tokio::test]
async fn clock_at_the_end_of_time() {
    for t in [i64::MAX, i64::MAX - 1, i64::MIN, 0] {
        let clock = ManualClock::new(Timestamp::from_unix_millis(t));
        let idem = Idem::new(MemoryStore::new()).with_clock(clock.clone());
        let runs = Runs::default();
        call(&idem, "k", &json!({}), &runs).await.expect("first");
        clock.advance(Duration::MAX);
        let _ = call(&idem, "k", &json!({}), &runs).await;
        assert!(runs.get() >= 1);
    }
}
