//! End to end over loopback (client.md §11): the middleware against a real
//! `idem-http` layer on a durable store (a SQLite file, a Postgres schema and
//! a Redis key prefix, one module each), the handler's runs counted in a table
//! of that same database, so both survive a server restart. Every case
//! asserts the run count, the outcome, the attempts and one key on every
//! attempt.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use axum::http::StatusCode;
use idem_client::{
    Error, IdemResponseExt, IdempotencyMiddleware, IdempotentRequestExt, Intent, ReportKind, Sent,
    StopReason,
};
use support::{
    Backend, Fault, RESPONSE_TTL, World, client, client_with, exhausted_at_deadline, fault_proxy,
    one_key, sent,
};

/// One `#[tokio::test]` per case, on `$backend`.
macro_rules! e2e_suite {
    ($backend:expr) => {
        e2e_suite!(@each $backend;
            fresh_then_replay_is_marked_and_runs_once,
            transient_503_is_retried_until_it_succeeds_once,
            in_flight_duplicate_is_waited_out_and_replayed,
            in_flight_sequence,
            concurrent_sends_one_intent,
            handler_422_not_retried,
            fingerprint_mismatch_is_terminal,
            response_expired_is_already_processed,
            store_unavailable_then_ok,
            deadline_bounds_the_send,
            persisted_intent_survives_client_restart,
            key_lifetime_refuses,
            streaming_body_refused,
            outer_retry_layer_keeps_key,
            structured_and_bare_keys,
            get_passes_through_without_a_key,
            dropped_response_is_replayed,
            timed_out_attempt_landing_late_runs_once,
        );
        /// Current-thread: the retry events are read from a thread-local subscriber.
        #[tokio::test(flavor = "current_thread")]
        async fn server_restart_between_attempts() {
            crate::support::run($backend, super::server_restart_between_attempts).await;
        }
    };
    (@each $backend:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                crate::support::run($backend, super::$name).await;
            }
        )+
    };
}

mod sqlite_file {
    use crate::support::Backend;
    e2e_suite!(Backend::SqliteFile);
}

mod postgres {
    use crate::support::Backend;
    e2e_suite!(Backend::Postgres);
}

mod redis {
    use crate::support::Backend;
    e2e_suite!(Backend::Redis);
}

fn body_json() -> &'static str {
    r#"{"amount":100}"#
}

async fn fresh_then_replay_is_marked_and_runs_once(w: World) {
    let c = client();
    let intent = Intent::derive("orders", "e2e-replay");
    let send = || {
        c.post(w.url("/orders"))
            .header("content-type", "application/json")
            .body(body_json())
            .intent(&intent)
            .send()
    };
    let first = send().await.unwrap();
    let r = first.idem_report().unwrap().clone();
    assert_eq!((r.kind, r.attempts), (ReportKind::Fresh, 1));
    let Sent::Fresh(first) = first.idem().unwrap() else {
        panic!("not fresh")
    };
    let first_body = first.text().await.unwrap();
    let second = send().await.unwrap();
    assert_eq!(second.idem_report().unwrap().kind, ReportKind::Replayed);
    let Sent::Replayed(second) = second.idem().unwrap() else {
        panic!("not replayed")
    };
    assert_eq!(second.status(), 201);
    assert_eq!(second.text().await.unwrap(), first_body);
    assert_eq!(w.runs().await, 1);
    // The intent's key, as an sf-string, on both sends.
    let keys = w.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(one_key(&keys), format!("\"{}\"", intent.key()));
}

async fn transient_503_is_retried_until_it_succeeds_once(w: World) {
    w.knobs.fail.store(2, Ordering::SeqCst);
    let c = client();
    let (resp, r) = sent(c.post(w.url("/flaky")).body("{}")).await;
    assert_eq!(resp.status(), 201);
    assert_eq!((r.kind, r.attempts), (ReportKind::Fresh, 3));
    // Two released 503s and one stored success: three runs, one key.
    w.ran_with_one_key(3, 3).await;
    // The stored success is never run again: resending the minted key
    // (row 23: the caller resends with `report.key`) replays it.
    let again = c
        .post(w.url("/flaky"))
        .body("{}")
        .idempotency_key(r.key.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(again.idem_report().unwrap().kind, ReportKind::Replayed);
    assert_eq!(w.runs().await, 3);
}

async fn in_flight_duplicate_is_waited_out_and_replayed(w: World) {
    let c1 = client();
    let c2 = client();
    let intent = Intent::random();
    let url = w.url("/slow");
    let a = c1.post(&url).body("{}").intent(&intent).send();
    let b = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c2.post(&url).body("{}").intent(&intent).send().await
    };
    let (a, b) = tokio::join!(a, b);
    let (a, b) = (a.unwrap(), b.unwrap());
    let (ra, rb) = (
        a.idem_report().unwrap().clone(),
        b.idem_report().unwrap().clone(),
    );
    assert_eq!((ra.kind, ra.attempts), (ReportKind::Fresh, 1));
    // The duplicate got 409 in_flight, waited Retry-After, and got the replay.
    assert_eq!((rb.kind, rb.attempts), (ReportKind::Replayed, 2), "{rb:?}");
    assert!(rb.elapsed >= Duration::from_secs(1), "{rb:?}");
    assert_eq!(a.text().await.unwrap(), b.text().await.unwrap());
    assert_eq!(w.runs().await, 1);
    one_key(&w.keys());
}

/// Handler 1.5 s, lease 3 s, attempt timeout 300 ms: a timeout (ambiguous),
/// a 409 `in_flight` whose `Retry-After` (the lease left, 3 s on the
/// server's stopped clock) is waited in full, then the replay.
async fn in_flight_sequence(w: World) {
    let c = client_with(
        IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .attempt_timeout(Some(Duration::from_millis(300)))
            .deadline(Duration::from_secs(10)),
    );
    let (resp, r) = sent(c.post(w.url("/slow")).body("{}")).await;
    // Three attempts on an unloaded machine; one more if a 409 itself took
    // longer than the attempt timeout.
    assert_eq!(r.kind, ReportKind::Replayed, "{r:?}");
    assert!(r.attempts >= 3, "{r:?}");
    // Attempt 2 came after the 300 ms timeout and got `Retry-After: 3`: the
    // replay came no earlier than that.
    assert!(r.elapsed >= Duration::from_millis(3_300), "{r:?}");
    assert_eq!(resp.status(), 201);
    // Every attempt reached the server, the timed-out one included.
    w.ran_with_one_key(1, r.attempts as usize).await;
}

/// Two clients send one intent with the same body at the same moment: one
/// runs it, the other waits out the 409 and gets the same answer replayed.
async fn concurrent_sends_one_intent(w: World) {
    let intent = Intent::random();
    let url = w.url("/slow");
    let (c1, c2) = (client(), client());
    let (a, b) = tokio::join!(
        c1.post(&url).body(body_json()).intent(&intent).send(),
        c2.post(&url).body(body_json()).intent(&intent).send(),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut kinds = [a.idem_report().unwrap().kind, b.idem_report().unwrap().kind];
    kinds.sort_by_key(|k| k.as_str());
    assert_eq!(kinds, [ReportKind::Fresh, ReportKind::Replayed]);
    assert_eq!(
        (a.status(), b.status()),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert_eq!(a.text().await.unwrap(), b.text().await.unwrap());
    assert_eq!(w.runs().await, 1);
    assert!(w.keys().len() >= 3, "the loser retried: {:?}", w.keys());
    one_key(&w.keys());
}

async fn handler_422_not_retried(w: World) {
    let c = client();
    let intent = Intent::random();
    let send = || c.post(w.url("/validate")).body("{}").intent(&intent).send();
    let first = send().await.unwrap();
    let r = first.idem_report().unwrap().clone();
    assert_eq!(
        (first.status().as_u16(), r.kind, r.attempts),
        (422, ReportKind::Fresh, 1)
    );
    assert!(matches!(first.idem().unwrap(), Sent::Fresh(_)));
    let second = send().await.unwrap();
    let r = second.idem_report().unwrap().clone();
    assert_eq!(second.status(), 422);
    assert_eq!((r.kind, r.attempts), (ReportKind::Replayed, 1));
    w.ran_with_one_key(1, 2).await;
}

async fn fingerprint_mismatch_is_terminal(w: World) {
    let c = client();
    let intent = Intent::random();
    let url = w.url("/orders");
    let first = c
        .post(&url)
        .body(r#"{"amount":1}"#)
        .intent(&intent)
        .send()
        .await
        .unwrap();
    assert_eq!(first.idem_report().unwrap().kind, ReportKind::Fresh);
    let (other, r) = sent(c.post(&url).body(r#"{"amount":2}"#).intent(&intent)).await;
    assert_eq!(
        (other.status().as_u16(), r.kind, r.attempts),
        (422, ReportKind::Rejected, 1)
    );
    match other.idem() {
        Err(Error::Rejected { problem, key, .. }) => {
            assert_eq!(problem.code.as_deref(), Some("fingerprint_mismatch"));
            assert_eq!(&key, intent.key());
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    w.ran_with_one_key(1, 2).await;
}

/// Row 11: past the server's `response_ttl` (its clock moved, not ours),
/// the key is still known: 409 `response_expired` with the resource id is
/// "already processed", never a second run and never retried.
async fn response_expired_is_already_processed(w: World) {
    let c = client();
    let intent = Intent::random();
    let send = || {
        c.post(w.url("/orders"))
            .header("x-resource", "ord_77")
            .body(body_json())
            .intent(&intent)
            .send()
    };
    assert_eq!(
        send().await.unwrap().idem_report().unwrap().kind,
        ReportKind::Fresh
    );
    w.knobs.clock.advance(RESPONSE_TTL + Duration::from_secs(1));
    let resp = send().await.unwrap();
    let r = resp.idem_report().unwrap().clone();
    assert_eq!((r.kind, r.attempts), (ReportKind::AlreadyProcessed, 1));
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    match resp.idem().unwrap() {
        Sent::AlreadyProcessed {
            resource_id,
            problem,
            key,
        } => {
            assert_eq!(resource_id.as_deref(), Some("ord_77"));
            assert_eq!(problem.code.as_deref(), Some("response_expired"));
            assert_eq!(&key, intent.key());
        }
        other => panic!("expected AlreadyProcessed, got {other:?}"),
    }
    w.ran_with_one_key(1, 2).await;
}

/// Row 18: the store fails the claim twice (503 `store_unavailable`,
/// `Retry-After: 1`); the client waits at least a second each time.
async fn store_unavailable_then_ok(w: World) {
    w.knobs.fail_claims.store(2, Ordering::SeqCst);
    let c = client();
    let (resp, r) = sent(c.post(w.url("/orders")).body(body_json())).await;
    assert_eq!((r.kind, r.attempts), (ReportKind::Fresh, 3), "{r:?}");
    assert_eq!(resp.status(), 201);
    assert!(r.elapsed >= Duration::from_secs(2), "{r:?}");
    w.ran_with_one_key(1, 3).await;
}

async fn deadline_bounds_the_send(w: World) {
    let c = client_with(IdempotencyMiddleware::builder().deadline(Duration::from_secs(2)));
    let t0 = Instant::now();
    let resp = c.post(w.url("/busy")).body("{}").send().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3));
    let r = resp.idem_report().unwrap().clone();
    // `Retry-After: 30` is inside `max_retry_after` but past the deadline:
    // no second attempt.
    assert_eq!(
        (r.kind, r.attempts),
        (ReportKind::Exhausted(StopReason::Deadline), 1)
    );
    let key = exhausted_at_deadline(resp.idem());
    assert_eq!(format!("\"{key}\""), one_key(&w.keys()));
    // The 503 is the handler's own (released, not stored): it ran for the
    // one attempt there was.
    assert_eq!(w.runs().await, 1);
    assert_eq!(w.keys().len(), 1);
}

/// The response is lost (the server stored the outcome but never answered)
/// and the client process dies mid-send; the persisted `Intent`, loaded by
/// a new client, gets the replay: one run.
async fn persisted_intent_survives_client_restart(w: World) {
    let intent = Intent::derive("orders", "ord_restart");
    let saved = serde_json::to_string(&intent).unwrap();
    w.knobs.hold_after_store.store(true, Ordering::SeqCst);
    let first = {
        let c = client();
        let url = w.url("/orders");
        tokio::spawn(async move {
            c.post(url)
                .body(body_json())
                .intent(&intent)
                .send()
                .await
                .map(|r| r.status())
        })
    };
    tokio::time::timeout(Duration::from_secs(10), w.knobs.stored.notified())
        .await
        .expect("the outcome was stored");
    // The client dies with its send in flight.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let loaded: Intent = serde_json::from_str(&saved).unwrap();
    let (resp, r) = sent(
        client()
            .post(w.url("/orders"))
            .body(body_json())
            .intent(&loaded),
    )
    .await;
    assert_eq!((r.kind, r.attempts), (ReportKind::Replayed, 1), "{r:?}");
    assert_eq!(resp.status(), 201);
    assert_eq!(
        w.ran_with_one_key(1, 2).await,
        format!("\"{}\"", loaded.key())
    );
}

async fn key_lifetime_refuses(w: World) {
    let c = client_with(
        IdempotencyMiddleware::builder().key_lifetime(Some(Duration::from_secs(30 * 86_400))),
    );
    let old =
        Intent::random().with_created_at(SystemTime::now() - Duration::from_secs(40 * 86_400));
    // As a caller would have it: stored, then loaded.
    let old: Intent = serde_json::from_str(&serde_json::to_string(&old).unwrap()).unwrap();
    let err = c
        .post(w.url("/orders"))
        .body("{}")
        .intent(&old)
        .send()
        .await
        .unwrap_err();
    match Error::from_middleware(&err) {
        Some(Error::KeyLifetimeExceeded { key }) => assert_eq!(key, old.key()),
        other => panic!("expected KeyLifetimeExceeded, got {other:?}"),
    }
    assert_eq!(w.runs().await, 0);
    assert!(w.keys().is_empty(), "nothing reached the server");
}

async fn streaming_body_refused(w: World) {
    let c = client();
    let stream = || {
        reqwest::Body::wrap_stream(futures_util::stream::iter([Ok::<_, std::io::Error>(
            bytes::Bytes::from_static(b"{}"),
        )]))
    };
    let err = c
        .post(w.url("/orders"))
        .body(stream())
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(Error::from_middleware(&err), Some(Error::BodyNotReplayable)),
        "{err:?}"
    );
    assert!(w.keys().is_empty(), "nothing reached the server");
    let (_once, r) = sent(c.post(w.url("/orders")).body(stream()).single_attempt()).await;
    assert_eq!((r.kind, r.attempts), (ReportKind::Fresh, 1));
    assert_eq!(w.runs().await, 1);
    assert_eq!(w.keys().len(), 1, "sent once, with a key");
}

/// A retry layer *above* the idempotency middleware (as reqwest-retry is):
/// it sends each request twice through the same extensions.
struct SendTwice;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for SendTwice {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let copy = req.try_clone().unwrap();
        let _first = next.clone().run(req, extensions).await?;
        next.run(copy, extensions).await
    }
}

/// The outer layer's first pass loses its response (`DropResponse`); the
/// middleware inside retries with its key; the outer layer's second pass
/// finds that key in the extensions and gets the replay.
async fn outer_retry_layer_keeps_key(w: World) {
    let proxy = fault_proxy(w.base(), vec![Fault::DropResponse]).await;
    let inner = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let c = reqwest_middleware::ClientBuilder::new(inner)
        .with(SendTwice)
        .with(
            IdempotencyMiddleware::builder()
                .backoff(Duration::from_millis(10), Duration::from_millis(50))
                .build()
                .unwrap(),
        )
        .build();
    let (_resp, r) = sent(c.post(format!("{}/orders", proxy.base)).body("{}")).await;
    assert_eq!((r.kind, r.attempts), (ReportKind::Replayed, 1), "{r:?}");
    // Dropped, replayed (inner retry), replayed (outer second pass).
    assert_eq!(w.keys().len(), 3);
    assert_eq!(one_key(&w.keys()), format!("\"{}\"", r.key));
    assert_eq!(w.runs().await, 1);
}

async fn structured_and_bare_keys(w: World) {
    let c = client();
    let url = w.url("/orders");
    let a = c
        .post(&url)
        .header("idempotency-key", "\"k-1\"")
        .body("{}")
        .send()
        .await
        .unwrap();
    let b = c
        .post(&url)
        .header("idempotency-key", "k-1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(a.idem_report().unwrap().kind, ReportKind::Fresh);
    assert_eq!(b.idem_report().unwrap().kind, ReportKind::Replayed);
    assert_eq!(w.keys(), vec!["\"k-1\"".to_owned(), "k-1".to_owned()]);
    assert_eq!(w.runs().await, 1);
    // The `Bare` syntax writes a minted key as is.
    let bare =
        client_with(IdempotencyMiddleware::builder().key_syntax(idem_client::KeyEncoding::Bare));
    let intent = Intent::random();
    let resp = bare
        .post(&url)
        .body("{}")
        .intent(&intent)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.idem_report().unwrap().kind, ReportKind::Fresh);
    assert_eq!(w.keys()[2], intent.key().as_str());
    assert_eq!(w.runs().await, 2);
    // A bad caller key is refused before anything is sent.
    let err = c
        .post(&url)
        .header("idempotency-key", "\"\"")
        .body("{}")
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(Error::from_middleware(&err), Some(Error::InvalidKey(_))),
        "{err:?}"
    );
    assert_eq!(w.keys().len(), 3);
}

async fn get_passes_through_without_a_key(w: World) {
    let resp = client().get(w.url("/orders")).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert!(resp.idem_report().is_none());
    assert!(w.keys().is_empty());
    assert_eq!(w.runs().await, 0);
}

async fn dropped_response_is_replayed(w: World) {
    let proxy = fault_proxy(w.base(), vec![Fault::DropResponse, Fault::Pass]).await;
    let (resp, r) = sent(
        client()
            .post(format!("{}/orders", proxy.base))
            .body(body_json()),
    )
    .await;
    // Row 2 (ambiguous) then row 4: the retry gets the stored answer.
    assert_eq!((r.kind, r.attempts), (ReportKind::Replayed, 2), "{r:?}");
    assert_eq!(resp.status(), 201);
    w.ran_with_one_key(1, 2).await;
}

/// Row 2, a client timeout after the request was written: the proxy holds
/// attempt 1 (its bytes already sent) past the 200 ms attempt timeout and
/// delivers it only after attempt 2 has run and stored the outcome. The late
/// duplicate reaches the server with the same key and is answered from the
/// record: one run.
async fn timed_out_attempt_landing_late_runs_once(w: World) {
    let proxy = fault_proxy(
        w.base(),
        vec![Fault::Delay(Duration::from_millis(800)), Fault::Pass],
    )
    .await;
    let c = client_with(
        IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .attempt_timeout(Some(Duration::from_millis(200)))
            .deadline(Duration::from_secs(10)),
    );
    let (_resp, r) = sent(c.post(format!("{}/orders", proxy.base)).body(body_json())).await;
    assert_eq!((r.kind, r.attempts), (ReportKind::Fresh, 2), "{r:?}");
    assert_eq!(w.keys().len(), 1, "attempt 1 is still held by the proxy");
    // Bounded: the held attempt arrives about 800 ms after it was sent.
    let t0 = Instant::now();
    while w.keys().len() < 2 && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(w.keys().len(), 2, "the late attempt reached the server");
    one_key(&w.keys());
    // Let it be answered (a replay, or a 409 while attempt 2's record was
    // in flight): never a second run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(w.runs().await, 1);
}

/// The server stores the outcome, then stops before answering (its runtime
/// shut down: listener, connections and store handles gone) and comes back
/// 1.5 s later on the same port over a store opened anew at the same place.
/// The client sees the dropped connection, then refused connections (row
/// 1), then the replay: one run, counted in the database.
async fn server_restart_between_attempts(mut w: World) {
    let capture = Capture::default();
    let lines = Arc::clone(&capture.lines);
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(capture));
    let c = client_with(
        IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(50), Duration::from_millis(200))
            .max_attempts(100)
            .deadline(Duration::from_secs(15)),
    );
    w.knobs.hold_after_store.store(true, Ordering::SeqCst);
    let send = c.post(w.url("/orders")).body(body_json()).send();
    let restart = async {
        tokio::time::timeout(Duration::from_secs(10), w.knobs.stored.notified())
            .await
            .expect("the outcome was stored");
        w.stop();
        let down = Instant::now();
        // Counted in the database while nothing serves it.
        assert_eq!(w.runs.get().await, 1);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        w.restart().await;
        down.elapsed()
    };
    let (resp, down) = tokio::join!(send, restart);
    let resp = resp.unwrap();
    let r = resp.idem_report().unwrap().clone();
    assert_eq!(r.kind, ReportKind::Replayed, "{r:?}");
    assert!(
        r.attempts >= 3,
        "dropped, refused at least once, replayed: {r:?}"
    );
    assert!(r.elapsed >= down, "{r:?}");
    assert_eq!(resp.status(), 201);
    let body = resp.text().await.unwrap();
    assert!(body.starts_with(r#"{"id":"ord_1""#), "{body}");
    // The dropped attempt and the replay reached a server, with one key.
    w.ran_with_one_key(1, 2).await;
    let lines = lines.lock().unwrap().clone().join("\n");
    assert!(
        lines.contains("reason=transport"),
        "the dropped response: {lines}"
    );
    assert!(
        lines.contains("reason=connect"),
        "refused while down: {lines}"
    );
}

/// Backend-neutral cases, once: no server, a server that is not idem, the tracing span.
mod plain {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_refused_is_retried_then_exhausted_with_the_key() {
        // A port that was just free: bind, note it, close.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let c = client_with(
            IdempotencyMiddleware::builder()
                .backoff(Duration::from_millis(5), Duration::from_millis(20))
                .max_attempts(3),
        );
        let intent = Intent::random();
        let err = c
            .post(format!("http://{addr}/orders"))
            .body("{}")
            .intent(&intent)
            .send()
            .await
            .unwrap_err();
        match Error::from_middleware(&err) {
            Some(Error::Exhausted {
                key,
                attempts,
                reason,
                last_status,
                ..
            }) => {
                assert_eq!(key, intent.key());
                assert_eq!(*attempts, 3);
                assert_eq!(*reason, StopReason::Transport);
                assert_eq!(*last_status, None);
            }
            other => panic!("expected Exhausted, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn one_span_per_send_with_the_key_hash_never_the_key() {
        crate::support::run(Backend::SqliteFile, |w| async move {
            let capture = Capture::default();
            let lines = Arc::clone(&capture.lines);
            let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(capture));
            // `support::run` installed the quiet global subscriber first,
            // so no callsite caches "never" (see
            // `support::quiet_global_subscriber`).
            w.knobs.fail.store(1, Ordering::SeqCst);
            let intent = Intent::random();
            let resp = client()
                .post(format!("{}/flaky?token=secret", w.base()))
                .body("{}")
                .intent(&intent)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.idem_report().unwrap().attempts, 2);
            let lines = lines.lock().unwrap().clone();
            let all = lines.join("\n");
            let spans: Vec<_> = lines
                .iter()
                .filter(|l| l.starts_with("span idem.client.send"))
                .collect();
            assert_eq!(spans.len(), 1, "{all}");
            assert!(spans[0].contains(&intent.key().log_hash()), "{all}");
            assert!(spans[0].contains("url.path=\"/flaky\""), "{all}");
            assert!(all.contains("idem.attempts=2"), "{all}");
            assert!(all.contains("idem.outcome=\"fresh\""), "{all}");
            assert!(all.contains("http.response.status_code=201"), "{all}");
            assert!(all.contains("reason=status_503"), "one retry event: {all}");
            assert!(
                !all.contains(intent.key().as_str()),
                "the raw key leaked: {all}"
            );
            assert!(!all.contains("secret"), "the query string leaked: {all}");
        })
        .await;
    }
}

/// A minimal subscriber that writes down what `idem_client` emits: spans
/// (with their later records) and events, as `name field=value` lines.
#[derive(Default)]
struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    ours: Mutex<std::collections::HashSet<u64>>,
    next: AtomicUsize,
}

struct Line<'a>(&'a mut String);

impl tracing::field::Visit for Line<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        if attrs.metadata().target().starts_with("idem_client") {
            self.ours.lock().unwrap().insert(id);
            let mut s = format!("span {}", attrs.metadata().name());
            attrs.record(&mut Line(&mut s));
            self.lines.lock().unwrap().push(s);
        }
        tracing::span::Id::from_u64(id)
    }
    fn record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        if self.ours.lock().unwrap().contains(&id.into_u64()) {
            let mut s = "record".to_owned();
            values.record(&mut Line(&mut s));
            self.lines.lock().unwrap().push(s);
        }
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target().starts_with("idem_client") {
            let mut s = "event".to_owned();
            event.record(&mut Line(&mut s));
            self.lines.lock().unwrap().push(s);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
