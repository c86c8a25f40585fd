//! The tower front-end over an in-process axum app behind a real `idem-http`
//! layer (MemoryStore): the same policy and key rules as the reqwest
//! middleware, the handler's runs counted.

#![allow(clippy::unwrap_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::State,
    http::{Request, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use http_body_util::BodyExt;
use idem_client::{Error, IdempotencyClientLayer, Intent, Report, ReportKind};
use idem_core::{Idem, MemoryStore, Policy};
use idem_http::{FixedOwner, IdempotencyLayer};
use tower::BoxError;
use tower::{Layer, ServiceExt};

#[derive(Clone, Default)]
struct Counters {
    runs: Arc<AtomicUsize>,
    fail: Arc<AtomicUsize>,
}

async fn orders(State(c): State<Counters>) -> Response {
    let n = c.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if c.fail
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
        .is_ok()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "later").into_response();
    }
    (StatusCode::CREATED, format!(r#"{{"id":"ord_{n}"}}"#)).into_response()
}

async fn slow(State(c): State<Counters>) -> Response {
    tokio::time::sleep(Duration::from_millis(700)).await;
    let n = c.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!(r#"{{"id":"ord_{n}"}}"#)).into_response()
}

fn app(c: &Counters) -> Router {
    let policy = Policy::builder()
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let idem = Idem::new(MemoryStore::new()).with_policy(policy);
    let layer = IdempotencyLayer::builder(idem)
        .owner(FixedOwner::new("tenant"))
        .build()
        .unwrap();
    Router::new()
        .route("/orders", post(orders))
        .route("/slow", post(slow))
        .route_layer(layer)
        .with_state(c.clone())
}

fn layer() -> IdempotencyClientLayer {
    IdempotencyClientLayer::builder()
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .deadline(Duration::from_secs(10))
        .build_layer()
        .unwrap()
}

fn post_req(path: &str, body: &'static str, intent: &Intent) -> Request<Body> {
    let mut req = Request::post(path).body(Body::from(body)).unwrap();
    req.extensions_mut().insert(intent.clone());
    req
}

async fn send(
    router: &Router,
    req: Request<Body>,
) -> Result<(StatusCode, Report, String), BoxError> {
    let resp = layer().layer(router.clone()).oneshot(req).await?;
    let report = resp.extensions().get::<Report>().unwrap().clone();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Ok((status, report, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn tower_fresh_then_replayed_runs_once() {
    let c = Counters::default();
    let router = app(&c);
    let intent = Intent::random();
    let (s1, r1, b1) = send(&router, post_req("/orders", "{}", &intent))
        .await
        .unwrap();
    let (s2, r2, b2) = send(&router, post_req("/orders", "{}", &intent))
        .await
        .unwrap();
    assert_eq!(
        (s1, r1.kind, r1.attempts),
        (StatusCode::CREATED, ReportKind::Fresh, 1)
    );
    assert_eq!((s2, r2.kind), (StatusCode::CREATED, ReportKind::Replayed));
    assert_eq!(b1, b2);
    assert_eq!(c.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn tower_transient_503_retried_with_the_same_key() {
    let c = Counters::default();
    c.fail.store(2, Ordering::SeqCst);
    let router = app(&c);
    let (s, r, _) = send(&router, post_req("/orders", "{}", &Intent::random()))
        .await
        .unwrap();
    assert_eq!(
        (s, r.kind, r.attempts),
        (StatusCode::CREATED, ReportKind::Fresh, 3)
    );
    assert_eq!(c.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn tower_fingerprint_mismatch_is_rejected_once() {
    let c = Counters::default();
    let router = app(&c);
    let intent = Intent::random();
    send(&router, post_req("/orders", r#"{"a":1}"#, &intent))
        .await
        .unwrap();
    let (s, r, _) = send(&router, post_req("/orders", r#"{"a":2}"#, &intent))
        .await
        .unwrap();
    assert_eq!(
        (s, r.kind, r.attempts),
        (StatusCode::UNPROCESSABLE_ENTITY, ReportKind::Rejected, 1)
    );
    assert_eq!(
        r.problem.unwrap().code.as_deref(),
        Some("fingerprint_mismatch")
    );
    assert_eq!(c.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_concurrent_sends_of_one_intent() {
    let c = Counters::default();
    let router = app(&c);
    let intent = Intent::random();
    let a = send(&router, post_req("/slow", "{}", &intent));
    let b = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        send(&router, post_req("/slow", "{}", &intent)).await
    };
    let (a, b) = tokio::join!(a, b);
    let ((_, ra, ba), (_, rb, bb)) = (a.unwrap(), b.unwrap());
    assert_eq!(ra.kind, ReportKind::Fresh);
    assert_eq!(rb.kind, ReportKind::Replayed);
    assert!(rb.attempts >= 2, "{rb:?}");
    assert_eq!(ba, bb);
    assert_eq!(c.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn tower_body_over_the_limit_is_not_sent() {
    let c = Counters::default();
    let router = app(&c);
    let svc = layer().max_request_body(4).layer(router);
    let err = svc
        .oneshot(post_req("/orders", "{\"long\":1}", &Intent::random()))
        .await
        .unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::BodyNotReplayable)),
        "{err:?}"
    );
    assert_eq!(c.runs.load(Ordering::SeqCst), 0);
}
