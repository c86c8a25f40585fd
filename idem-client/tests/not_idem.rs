//! The decision table against a server that is not idem (client.md §11, and
//! issue 20's "so the client is useful beyond our own server"): a small
//! Stripe-like API with its own idempotency rules, as Stripe documents them.
//!
//! * The key is the raw header value (the client sends it bare here).
//! * The first request with a key runs and its result is saved, a `402` card
//!   decline included; a retry with the same parameters gets the saved result
//!   with `Idempotent-Replayed: true`.
//! * The same key with other parameters is a `400 idempotency_error`.
//! * A duplicate while the first still runs is a bare `409 idempotency_error`:
//!   no problem body, no `Retry-After`.
//! * A rate limiter in front answers `429` with `Retry-After`, and a load
//!   balancer `503` without one; neither reaches the idempotency layer, so
//!   nothing is saved and nothing runs.
//!
//! Every case counts the handler's runs and checks that every attempt carried
//! one key.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_client::{
    IdemResponseExt, IdempotencyMiddleware, IdempotentRequestExt, Intent, KeyEncoding, ReportKind,
    Sent,
};
use support::{Fault, client_with, exhausted_at_deadline, fault_proxy, one_key, sent};

/// What the API has saved under a key.
#[derive(Debug, Clone)]
enum Saved {
    Running,
    Done {
        params: Bytes,
        status: StatusCode,
        body: String,
    },
}

/// The Stripe-like API's state: saved results, handler runs, keys received,
/// and how many front-door refusals are still to come.
#[derive(Debug, Default)]
struct Api {
    saved: Mutex<HashMap<String, Saved>>,
    runs: AtomicUsize,
    keys: Mutex<Vec<String>>,
    rate_limited: AtomicUsize,
    unavailable: AtomicUsize,
}

#[derive(Debug, serde::Deserialize)]
struct Knobs {
    #[serde(default)]
    slow_ms: u64,
}

fn stripe_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "type": kind, "message": message } });
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn charges(
    State(api): State<Arc<Api>>,
    Query(knobs): Query<Knobs>,
    headers: HeaderMap,
    params: Bytes,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(k) = &key {
        api.keys.lock().unwrap().push(k.clone());
    }
    // The front door: refusals that never reach the idempotency layer.
    if api
        .rate_limited
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        let mut r = stripe_error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "Too many requests hit the API too quickly.",
        );
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
        return r;
    }
    if api
        .unavailable
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "upstream unavailable").into_response();
    }
    let Some(key) = key else {
        return stripe_error(StatusCode::BAD_REQUEST, "invalid_request_error", "no key");
    };
    {
        let mut saved = api.saved.lock().unwrap();
        match saved.get(&key) {
            Some(Saved::Running) => {
                return stripe_error(
                    StatusCode::CONFLICT,
                    "idempotency_error",
                    "There is currently another in-progress request using this Idempotency Key.",
                );
            }
            Some(Saved::Done {
                params: p,
                status,
                body,
            }) => {
                if *p != params {
                    return stripe_error(
                        StatusCode::BAD_REQUEST,
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same parameters they were first used with.",
                    );
                }
                let mut r = (*status, body.clone()).into_response();
                r.headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
                return r;
            }
            None => {
                saved.insert(key.clone(), Saved::Running);
            }
        }
    }
    // The charge itself.
    api.runs.fetch_add(1, Ordering::SeqCst);
    if knobs.slow_ms > 0 {
        tokio::time::sleep(Duration::from_millis(knobs.slow_ms)).await;
    }
    let declined = params.as_ref() == br#"{"amount":0}"#;
    let (status, body) = if declined {
        (
            StatusCode::PAYMENT_REQUIRED,
            r#"{"error":{"type":"card_error","code":"card_declined"}}"#.to_owned(),
        )
    } else {
        (
            StatusCode::OK,
            format!(r#"{{"id":"ch_{}"}}"#, api.runs.load(Ordering::SeqCst)),
        )
    };
    api.saved.lock().unwrap().insert(
        key,
        Saved::Done {
            params,
            status,
            body: body.clone(),
        },
    );
    (status, body).into_response()
}

/// The API on a loopback port, and its state.
struct Server {
    base: String,
    api: Arc<Api>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start() -> Self {
        let api = Arc::new(Api::default());
        let app = Router::new()
            .route("/v1/charges", post(charges))
            .with_state(Arc::clone(&api));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { base, api, task }
    }

    fn url(&self) -> String {
        format!("{}/v1/charges", self.base)
    }

    fn runs(&self) -> usize {
        self.api.runs.load(Ordering::SeqCst)
    }

    fn keys(&self) -> Vec<String> {
        self.api.keys.lock().unwrap().clone()
    }

    /// Asserts that the charge ran `runs` times and the API saw `sends`
    /// requests, all with one key.
    fn ran_with_one_key(&self, runs: usize, sends: usize) {
        assert_eq!(self.runs(), runs);
        assert_eq!(self.keys().len(), sends);
        one_key(&self.keys());
    }
}

/// The client as a Stripe user would set it: bare keys (Stripe takes the raw
/// value), short backoff for the tests.
fn stripe_client() -> idem_client::IdempotencyClientBuilder {
    IdempotencyMiddleware::builder()
        .key_syntax(KeyEncoding::Bare)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .deadline(Duration::from_secs(10))
}

const PARAMS: &str = r#"{"amount":100}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_then_replay_is_read_from_the_replay_header() {
    let s = Server::start().await;
    let c = client_with(stripe_client());
    let intent = Intent::random();
    let send = || c.post(s.url()).body(PARAMS).intent(&intent).send();
    let first = send().await.unwrap();
    let r = first.idem_report().unwrap().clone();
    assert_eq!(
        (first.status().as_u16(), r.kind, r.attempts),
        (200, ReportKind::Fresh, 1)
    );
    let Sent::Fresh(first) = first.idem().unwrap() else {
        panic!("not fresh")
    };
    let first_body = first.text().await.unwrap();
    let second = send().await.unwrap();
    let r = second.idem_report().unwrap().clone();
    assert_eq!((r.kind, r.attempts), (ReportKind::Replayed, 1));
    let Sent::Replayed(second) = second.idem().unwrap() else {
        panic!("not replayed")
    };
    assert_eq!(second.text().await.unwrap(), first_body);
    assert_eq!(s.runs(), 1);
    // Bare: the raw key, the same on both sends.
    assert_eq!(one_key(&s.keys()), intent.key().as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_response_is_retried_with_the_key_and_replayed() {
    let s = Server::start().await;
    let proxy = fault_proxy(s.base.clone(), vec![Fault::DropResponse, Fault::Pass]).await;
    let c = client_with(stripe_client());
    let (resp, r) = sent(c.post(format!("{}/v1/charges", proxy.base)).body(PARAMS)).await;
    assert_eq!(
        (resp.status().as_u16(), r.kind, r.attempts),
        (200, ReportKind::Replayed, 2)
    );
    s.ran_with_one_key(1, 2);
}

/// A bare 409 says neither "later" nor "done": by default it is the
/// server's answer (row 13); with `retry_conflicts` the client waits it out
/// with backoff and gets the saved result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_409_while_the_first_runs() {
    let s = Server::start().await;
    let intent = Intent::random();
    let slow = format!("{}?slow_ms=600", s.url());
    let first = {
        let c = client_with(stripe_client());
        let intent = intent.clone();
        let url = slow.clone();
        tokio::spawn(async move { c.post(url).body(PARAMS).intent(&intent).send().await })
    };
    // Wait until the first is running (its key is saved as running).
    let t0 = Instant::now();
    while s.runs() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the first never ran");
        tokio::task::yield_now().await;
    }
    let default = client_with(stripe_client());
    let (resp, r) = sent(default.post(&slow).body(PARAMS).intent(&intent)).await;
    assert_eq!(
        (resp.status().as_u16(), r.kind, r.attempts),
        (409, ReportKind::Fresh, 1)
    );
    // Backoff polls until the first ends (the deadline bounds them).
    let waiting = client_with(stripe_client().retry_conflicts(true).max_attempts(200));
    let (resp, r) = sent(waiting.post(&slow).body(PARAMS).intent(&intent)).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(r.kind, ReportKind::Replayed, "{r:?}");
    assert!(r.attempts >= 2, "{r:?}");
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.idem_report().unwrap().kind, ReportKind::Fresh);
    assert_eq!(s.runs(), 1);
    one_key(&s.keys());
}

/// Other parameters under a used key: Stripe's 400. Not retried, and the
/// first charge is not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_parameters_under_a_used_key_are_not_retried() {
    let s = Server::start().await;
    let c = client_with(stripe_client());
    let intent = Intent::random();
    c.post(s.url())
        .body(PARAMS)
        .intent(&intent)
        .send()
        .await
        .unwrap();
    let (resp, r) = sent(c.post(s.url()).body(r#"{"amount":200}"#).intent(&intent)).await;
    assert_eq!((resp.status().as_u16(), r.attempts), (400, 1), "{r:?}");
    assert_ne!(r.kind, ReportKind::Replayed);
    assert_eq!(s.runs(), 1);
    assert_eq!(s.keys().len(), 2);
}

/// A card decline is the charge's own answer, saved: returned, not retried,
/// and replayed to the next send of the intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_402_is_the_answer_and_is_replayed() {
    let s = Server::start().await;
    let c = client_with(stripe_client());
    let intent = Intent::random();
    let send = || {
        c.post(s.url())
            .body(r#"{"amount":0}"#)
            .intent(&intent)
            .send()
    };
    let first = send().await.unwrap();
    let r = first.idem_report().unwrap().clone();
    assert_eq!(
        (first.status().as_u16(), r.kind, r.attempts),
        (402, ReportKind::Fresh, 1)
    );
    let second = send().await.unwrap();
    let r = second.idem_report().unwrap().clone();
    assert_eq!(
        (second.status().as_u16(), r.kind, r.attempts),
        (402, ReportKind::Replayed, 1)
    );
    assert_eq!(s.runs(), 1);
}

/// A 429 with `Retry-After: 1` from the front door: the retry waits at least
/// that long, with the same key, and the charge runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_429_waits_for_retry_after() {
    let s = Server::start().await;
    s.api.rate_limited.store(1, Ordering::SeqCst);
    let c = client_with(stripe_client());
    let (resp, r) = sent(c.post(s.url()).body(PARAMS)).await;
    assert_eq!(
        (resp.status().as_u16(), r.kind, r.attempts),
        (200, ReportKind::Fresh, 2)
    );
    assert!(r.elapsed >= Duration::from_secs(1), "{r:?}");
    s.ran_with_one_key(1, 2);
}

/// A 503 without `Retry-After` from a load balancer: retried with backoff
/// until the API answers; the charge runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_503_is_retried_with_backoff() {
    let s = Server::start().await;
    s.api.unavailable.store(2, Ordering::SeqCst);
    let c = client_with(stripe_client());
    let (resp, r) = sent(c.post(s.url()).body(PARAMS)).await;
    assert_eq!(
        (resp.status().as_u16(), r.kind, r.attempts),
        (200, ReportKind::Fresh, 3)
    );
    s.ran_with_one_key(1, 3);
}

/// A front door that keeps refusing: the send stops at its deadline with the
/// key, so the caller can resume the intent later; nothing ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_until_the_deadline_return_the_key() {
    let s = Server::start().await;
    s.api.unavailable.store(usize::MAX, Ordering::SeqCst);
    let c = client_with(
        stripe_client()
            .max_attempts(1_000)
            .deadline(Duration::from_millis(500)),
    );
    let intent = Intent::random();
    let resp = c
        .post(s.url())
        .body(PARAMS)
        .intent(&intent)
        .send()
        .await
        .unwrap();
    assert_eq!(&exhausted_at_deadline(resp.idem()), intent.key());
    assert_eq!(s.runs(), 0);
    assert!(s.keys().len() >= 2, "{:?}", s.keys());
    one_key(&s.keys());
}
