//! The HTTP conformance suite's scenarios, over gRPC: one per row of the
//! issue's table and per promise (replay, mismatch, in flight, transient
//! release, permanent replay, expired body, store down, missing owner,
//! streaming pass-through, a client that cancels mid-call).

use std::sync::Arc;
use std::time::Duration;

use idem_core::IdempotencyKey;
use idem_core::store::Store;
use tonic::{Code, Response, Status};
use tonic_types::StatusExt;

use super::app::{
    App, BY_FIELD, CREATE, Client, Gated, LEASE, MAX_REQUEST, Meta, OPEN, Options, RESPONSE_TTL,
    Req, Resp, gated, req, with,
};

fn key() -> String {
    IdempotencyKey::random().as_str().to_owned()
}

/// The default app, a client of it and a fresh key.
async fn start<S: Store>(store: Arc<S>) -> (App<S>, Client, String) {
    let app = App::start(store).await;
    let c = app.client().await;
    (app, c, key())
}

/// A rejection of the layer: its code, `ErrorInfo` (domain `idem`,
/// `reason`) and whether a `RetryInfo` came with it.
#[track_caller]
fn assert_rejected(s: &Status, code: Code, reason: &str, retry: Option<Duration>) {
    assert_eq!(s.code(), code, "{s:?}");
    let d = s.get_error_details();
    let info = d.error_info().expect("ErrorInfo");
    assert_eq!(info.domain, "idem");
    assert_eq!(info.reason, reason);
    assert_eq!(
        d.retry_info().and_then(|r| r.retry_delay),
        retry,
        "RetryInfo"
    );
    assert!(
        s.metadata().get("idempotent-replayed").is_none(),
        "a rejection is not a replay"
    );
}

/// No owner, and a malformed key (`a, b`).
fn malformed_key_alone() -> Meta {
    Meta {
        keys: vec![b"a, b".to_vec()],
        ..Meta::default()
    }
}

/// The store's rejection: `UNAVAILABLE`, `STORE_UNAVAILABLE`, retry in 1 s.
#[track_caller]
fn assert_store_unavailable(s: &Status) {
    let retry = Some(Duration::from_secs(1));
    assert_rejected(s, Code::Unavailable, "STORE_UNAVAILABLE", retry);
}

fn replayed(m: &tonic::metadata::MetadataMap) -> bool {
    m.get("idempotent-replayed").is_some_and(|v| v == "true")
}

/// `again` is a replay of `first`: the marker and the same message.
#[track_caller]
fn assert_replay_of(again: &Response<Resp>, first: &Response<Resp>) {
    assert!(replayed(again.metadata()));
    assert_eq!(again.get_ref(), first.get_ref());
}

/// Starts a [`Client::spawn_gated`] call under `k` and waits until its
/// handler has started.
async fn held<S: Store>(app: &App<S>, c: &Client, k: &str) -> Gated {
    let call = c.spawn_gated(k);
    app.counts.started.notified().await;
    call
}

/// Opens the gate of the held call `first` (a [`Client::spawn_gated`] under
/// `k`) and asserts that it ran once and that the retry is its replay.
async fn finish_gated<S: Store>(app: &App<S>, c: &Client, first: Gated, k: &str) {
    app.counts.open_gate();
    let first = first.await.expect("join").expect("first");
    let again = c.create(gated(), k).await.expect("replay");
    assert_replay_of(&again, &first);
    assert_eq!(app.counts.executions(), 1);
}

/// First call runs once; the retry is its replay: same message, same
/// metadata, the marker in the initial metadata; the first carries none.
pub async fn replay_is_byte_exact<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    let first = c.create(req(100), &k).await.expect("first");
    assert!(
        !replayed(first.metadata()),
        "a first execution carries no marker"
    );
    let again = c.create(req(100), &k).await.expect("retry");
    assert_replay_of(&again, &first);
    assert_eq!(again.metadata().get("x-execution").expect("kept"), "1");
    assert_eq!(first.metadata().get("traceparent").expect("sent"), "00-1");
    assert!(again.metadata().get("traceparent").is_none(), "not stored");
    assert_eq!(app.counts.executions(), 1);
    // The bare and the quoted key are one key.
    let quoted = format!("\"{k}\"");
    let q = c.create(req(100), &quoted).await.expect("quoted");
    assert!(replayed(q.metadata()));
    assert_eq!(app.counts.executions(), 1);
    // Another owner, same key: its own record.
    let other = c
        .call(CREATE, req(100), &with("a2", &k))
        .await
        .expect("other owner");
    assert!(!replayed(other.metadata()));
    assert_eq!(app.counts.executions(), 2);
}

/// Same key, other request: `FAILED_PRECONDITION`, `FINGERPRINT_MISMATCH`.
pub async fn mismatch_is_failed_precondition<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    c.create(req(100), &k).await.expect("first");
    let s = c.create(req(101), &k).await.expect_err("mismatch");
    assert_rejected(&s, Code::FailedPrecondition, "FINGERPRINT_MISMATCH", None);
    assert_eq!(app.counts.executions(), 1);
}

/// The first call still running: `ABORTED`, `IN_FLIGHT`, `RetryInfo` = the
/// lease remaining; once it finishes, the retry is its replay.
pub async fn in_flight_is_aborted_with_retry_info<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    let first = held(&app, &c, &k).await;
    let s = c.create(gated(), &k).await.expect_err("in flight");
    assert_rejected(&s, Code::Aborted, "IN_FLIGHT", Some(LEASE));
    finish_gated(&app, &c, first, &k).await;
}

/// A transient status (`UNAVAILABLE`) releases the key: the retry runs again.
pub async fn transient_status_releases_the_key<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    for n in 1..=2 {
        let s = c.create(req(13), &k).await.expect_err("transient");
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.message(), "provider_unavailable");
        assert!(!replayed(s.metadata()));
        assert_eq!(app.counts.executions(), n);
    }
}

/// A permanent status is stored and replayed, the marker in its trailers.
pub async fn permanent_status_is_replayed<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    for replay in [false, true] {
        let s = c.create(req(7), &k).await.expect_err("permanent");
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "insufficient_funds");
        assert_eq!(replayed(s.metadata()), replay);
        assert!(
            s.get_error_details().error_info().is_none(),
            "the handler's own status"
        );
    }
    assert_eq!(app.counts.executions(), 1);
}

/// Completed, body no longer kept: `FAILED_PRECONDITION`,
/// `RESPONSE_EXPIRED`, the resource id in the metadata.
pub async fn expired_body_is_response_expired<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    c.create(req(100), &k).await.expect("first");
    app.clock.advance(RESPONSE_TTL + Duration::from_secs(1));
    let s = c.create(req(100), &k).await.expect_err("expired");
    assert_rejected(&s, Code::FailedPrecondition, "RESPONSE_EXPIRED", None);
    assert_eq!(
        s.metadata()
            .get("idempotency-resource-id")
            .expect("resource id"),
        "res_1"
    );
    assert_eq!(app.counts.executions(), 1);
}

/// Store unreachable: `UNAVAILABLE`, `STORE_UNAVAILABLE`, a `RetryInfo`;
/// nothing ran; once it is back, the call runs.
pub async fn store_down_is_unavailable<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    app.store.fail_all(true);
    let s = c.create(req(100), &k).await.expect_err("down");
    assert_store_unavailable(&s);
    assert_eq!(app.counts.executions(), 0);
    app.store.fail_all(false);
    c.create(req(100), &k).await.expect("back");
    assert_eq!(app.counts.executions(), 1);
}

/// No owner: `UNAUTHENTICATED`, checked before the key (a malformed key
/// is not what is reported), the handler not run.
pub async fn missing_owner_is_unauthenticated<S: Store>(store: Arc<S>) {
    let (app, c, _) = start(store).await;
    let s = c
        .call(CREATE, req(100), &malformed_key_alone())
        .await
        .expect_err("no owner");
    assert_rejected(&s, Code::Unauthenticated, "OWNER_UNAVAILABLE", None);
    assert_eq!(app.counts.executions(), 0);
}

/// No key on a covered method: `INVALID_ARGUMENT`, `MISSING_KEY`; every
/// malformed form, and two entries: `INVALID_ARGUMENT`, `INVALID_KEY`.
pub async fn missing_and_invalid_keys_are_invalid_argument<S: Store>(store: Arc<S>) {
    let (app, c, _) = start(store).await;
    let none = Meta::owned_by("a1");
    let s = c.call(CREATE, req(100), &none).await.expect_err("missing");
    assert_rejected(&s, Code::InvalidArgument, "MISSING_KEY", None);
    let long = "k".repeat(256);
    // Every malformed form, then two entries.
    let bad: [&[&[u8]]; 7] = [
        &[b"\"\""],
        &[long.as_bytes()],
        &[b"a, b"],
        &[br#""a\qb""#],
        &[b"a\tb"],
        &[b"\"open"],
        &[b"k1", b"k1"],
    ];
    for keys in bad {
        let m = Meta {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
            ..Meta::owned_by("a1")
        };
        let s = c.call(CREATE, req(100), &m).await.expect_err("invalid");
        assert_rejected(&s, Code::InvalidArgument, "INVALID_KEY", None);
    }
    assert_eq!(app.counts.executions(), 0);
}

/// The key read from a field of the request (AIP-155's `request_id`).
pub async fn key_from_a_request_field<S: Store>(store: Arc<S>) {
    let (app, c, _) = start(store).await;
    let a1 = Meta::owned_by("a1");
    let s = c
        .call(BY_FIELD, req(100), &a1)
        .await
        .expect_err("no request_id");
    assert_rejected(&s, Code::InvalidArgument, "MISSING_KEY", None);
    let m = Req {
        request_id: key(),
        ..req(100)
    };
    let first = c.call(BY_FIELD, m.clone(), &a1).await.expect("first");
    let again = c.call(BY_FIELD, m, &a1).await.expect("again");
    assert_replay_of(&again, &first);
    assert_eq!(app.counts.executions(), 1);
}

/// Methods the layer does not cover, unary or streaming, pass untouched:
/// no owner, no key, a malformed key ignored, every call runs.
pub async fn uncovered_and_streaming_methods_pass_through<S: Store>(store: Arc<S>) {
    let (app, c, _) = start(store).await;
    let bad = malformed_key_alone();
    for _ in 0..2 {
        let r = c.call(OPEN, req(100), &bad).await.expect("open");
        assert!(!replayed(r.metadata()));
    }
    let items = c.watch(req(5)).await.expect("stream");
    assert_eq!(items.len(), 3);
    assert_eq!(items[2].id, "w3");
    assert_eq!(app.counts.executions(), 3);
}

/// A client that gives up mid-call (its deadline) does not abandon the
/// work: the handler runs to its end once, its outcome is stored, and the
/// retry is its replay.
pub async fn cancelled_call_completes_and_is_replayed<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    let mut m = with("a1", &k);
    m.timeout = Some(Duration::from_millis(200));
    let s = c.call(CREATE, gated(), &m).await.expect_err("gave up");
    assert!(
        matches!(s.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{s:?}"
    );
    assert_eq!(app.counts.finished(), 0, "still running");
    app.counts.open_gate();
    // The tracked work ends: the handler and the completion behind it.
    tokio::time::timeout(Duration::from_secs(10), app.layer.drain())
        .await
        .expect("work finished");
    assert_eq!(app.counts.finished(), 1);
    let again = c.create(gated(), &k).await;
    let again = again.expect("replayed");
    assert!(replayed(again.metadata()));
    assert_eq!(again.get_ref().execution, 1);
    assert_eq!(app.counts.executions(), 1);
}

/// A lease that ran out with the work unfinished (a crash) is taken over
/// by the next retry, which runs it again as a recovery.
pub async fn expired_lease_is_recovered<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    let first = held(&app, &c, &k).await;
    app.expire_lease();
    let second = held(&app, &c, &k).await;
    assert_eq!(app.counts.executions(), 2, "taken over as a recovery");
    app.counts.open_gate();
    app.counts.open_gate();
    let second = second.await.expect("join").expect("recovery");
    assert_eq!(second.get_ref().execution, 2);
    // The first holder's completion is fenced off: it is told so.
    let first = first.await.expect("join");
    if let Err(s) = &first {
        assert_rejected(s, Code::Aborted, "LEASE_LOST", Some(Duration::from_secs(1)));
    }
    assert_eq!(app.counts.executions(), 2);
}

/// With optional keys, a covered call without one runs unprotected (every
/// time); one with a key is still protected.
pub async fn optional_key_runs_unprotected<S: Store>(store: Arc<S>) {
    let opts = Options {
        optional_key: true,
        ..Options::default()
    };
    let app = App::with(store, opts).await;
    let c = app.client().await;
    let none = Meta::owned_by("a1");
    for n in 1..=2 {
        let r = c.call(CREATE, req(100), &none).await.expect("unprotected");
        assert!(!replayed(r.metadata()));
        assert_eq!(app.counts.executions(), n);
    }
    let k = key();
    c.create(req(100), &k).await.expect("first");
    let again = c.create(req(100), &k).await.expect("again");
    assert!(replayed(again.metadata()));
    assert_eq!(app.counts.executions(), 3);
}

/// A request message over the layer's limit: `RESOURCE_EXHAUSTED`,
/// `REQUEST_TOO_LARGE`, nothing claimed nor run.
pub async fn request_over_the_limit_is_resource_exhausted<S: Store>(store: Arc<S>) {
    let (app, c, _) = start(store).await;
    let big = Req {
        note: "x".repeat(MAX_REQUEST),
        ..req(100)
    };
    let k = key();
    let s = c.create(big, &k).await.expect_err("too large");
    assert_rejected(&s, Code::ResourceExhausted, "REQUEST_TOO_LARGE", None);
    assert_eq!(app.counts.executions(), 0);
    // The key was not claimed: a request under the limit runs with it.
    c.create(req(100), &k).await.expect("fits");
    assert_eq!(app.counts.executions(), 1);
}

/// The lease's end of `k`'s record (owner `a1`, method `CREATE`), as stored.
async fn lease_end<S: Store>(app: &App<S>, k: &str) -> idem_core::clock::Timestamp {
    use idem_core::clock::Clock as _;
    let scope = idem_core::Scope::new("a1", CREATE).unwrap();
    let id = idem_core::RecordId::new(scope, IdempotencyKey::parse(k).unwrap());
    app.store
        .fetch(&id, app.clock.now())
        .await
        .unwrap()
        .expect("the record")
        .lease_until
}

/// A handler that outlives its lease keeps its record: the layer renews
/// the lease while it runs, so a retry past the first lease's end gets
/// `ABORTED` (in flight), not a recovery that runs it a second time.
pub async fn a_handler_that_outlives_its_lease_is_not_run_twice<S: Store>(store: Arc<S>) {
    let lease = Duration::from_millis(300);
    let opts = Options {
        lease,
        ..Options::default()
    };
    let app = App::with(store, opts).await;
    let c = app.client().await;
    let k = key();
    let first = held(&app, &c, &k).await;
    let first_end = lease_end(&app, &k).await;
    // Half the lease passes; a renewal (every third of it, in the runtime's
    // time) moves the end a whole lease past the engine's now.
    app.clock.advance(lease / 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lease_end(&app, &k).await <= first_end {
        assert!(std::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    app.clock.advance(lease * 2 / 3);
    let s = c.create(gated(), &k).await.expect_err("still running");
    assert_eq!(s.code(), Code::Aborted, "{s:?}");
    assert_eq!(app.counts.executions(), 1, "not recovered while it runs");
    finish_gated(&app, &c, first, &k).await;
}

/// The store fails after the handler ran, and the handler saved no
/// resource id: the client gets `UNAVAILABLE` (never an answer for work a
/// retry could run again), and once the engine's background write stored
/// the outcome, the retry replays it; the handler ran once.
pub async fn an_outcome_not_stored_yet_is_unavailable_then_replayed<S: Store>(store: Arc<S>) {
    let (app, c, k) = start(store).await;
    app.store.fail_complete(true);
    let s = c.create(req(100), &k).await.expect_err("not stored yet");
    assert_store_unavailable(&s);
    app.store.fail_complete(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let replay = loop {
        match c.create(req(100), &k).await {
            Err(s) if s.code() == Code::Aborted => {
                assert!(std::time::Instant::now() < deadline, "never stored");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => break other.expect("replayed"),
        }
    };
    assert!(replayed(replay.metadata()));
    assert_eq!(app.counts.executions(), 1);
}
