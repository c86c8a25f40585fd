//! The tower front-end over hyper-util's client, end to end on loopback
//! (client.md §11: "the tower front-end reruns the first four cases"): a lost
//! response, a server restart, the in-flight sequence and two concurrent
//! sends of one intent, against the real `idem-http` layer on every durable
//! backend (the harness of `e2e.rs`).
//!
//! hyper's `Incoming` body is not `From<Bytes>`, which the layer needs to
//! hand back a problem body it read, so the response is mapped to axum's
//! `Body` under the layer.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use idem_client::{Intent, Report, ReportKind};
use support::{Fault, World, fault_proxy};
use tower::BoxError;
use tower::{Service, ServiceExt};

macro_rules! tower_suite {
    ($backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_response_is_replayed() {
            crate::support::run($backend, super::dropped_response_is_replayed).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn server_restart_between_attempts() {
            crate::support::run($backend, super::server_restart_between_attempts).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn in_flight_sequence() {
            crate::support::run($backend, super::in_flight_sequence).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrent_sends_one_intent() {
            crate::support::run($backend, super::concurrent_sends_one_intent).await;
        }
    };
}

mod sqlite_file {
    tower_suite!(crate::support::Backend::SqliteFile);
}

mod postgres {
    tower_suite!(crate::support::Backend::Postgres);
}

mod redis {
    tower_suite!(crate::support::Backend::Redis);
}

type Resp = Response<axum::body::Body>;

/// hyper-util's client (one connection per attempt) under the layer.
fn client(
    b: idem_client::IdempotencyClientBuilder,
) -> impl Service<Request<Full<Bytes>>, Response = Resp, Error = BoxError, Future: Send>
+ Clone
+ Send
+ Sync {
    let hyper = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Full<Bytes>>();
    tower::ServiceBuilder::new()
        .layer(b.build_layer().unwrap())
        .map_response(to_axum)
        .service(hyper)
}

fn to_axum<B>(r: Response<B>) -> Resp
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    r.map(axum::body::Body::new)
}

fn quick() -> idem_client::IdempotencyClientBuilder {
    idem_client::IdempotencyClientLayer::builder()
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .deadline(Duration::from_secs(10))
}

fn post(url: &str, intent: Option<&Intent>) -> Request<Full<Bytes>> {
    let mut req = Request::post(url)
        .body(Full::new(Bytes::from_static(br#"{"amount":100}"#)))
        .unwrap();
    if let Some(i) = intent {
        req.extensions_mut().insert(i.clone());
    }
    req
}

async fn send<S>(svc: &S, req: Request<Full<Bytes>>) -> (StatusCode, Report, Bytes)
where
    S: Service<Request<Full<Bytes>>, Response = Resp, Error = BoxError, Future: Send>
        + Clone
        + Send
        + Sync,
{
    let resp = svc.clone().oneshot(req).await.unwrap();
    let report = resp.extensions().get::<Report>().unwrap().clone();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, report, body)
}

async fn dropped_response_is_replayed(w: World) {
    let proxy = fault_proxy(w.base(), vec![Fault::DropResponse, Fault::Pass]).await;
    let c = client(quick());
    let (status, r, _) = send(&c, post(&format!("{}/orders", proxy.base), None)).await;
    assert_eq!(
        (status, r.kind, r.attempts),
        (StatusCode::CREATED, ReportKind::Replayed, 2)
    );
    w.ran_with_one_key(1, 2).await;
}

async fn server_restart_between_attempts(mut w: World) {
    let c = client(
        quick()
            .backoff(Duration::from_millis(50), Duration::from_millis(200))
            .max_attempts(100)
            .deadline(Duration::from_secs(15)),
    );
    w.knobs
        .hold_after_store
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let url = w.url("/orders");
    let sent = send(&c, post(&url, None));
    let restart = async {
        tokio::time::timeout(Duration::from_secs(10), w.knobs.stored.notified())
            .await
            .expect("the outcome was stored");
        w.stop();
        assert_eq!(w.runs.get().await, 1);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        w.restart().await;
    };
    let ((status, r, body), ()) = tokio::join!(sent, restart);
    // The dropped attempt, at least one refused while down, the replay.
    assert_replayed_after(status, &r, Duration::from_millis(1_500));
    assert!(body.starts_with(br#"{"id":"ord_1""#));
    w.ran_with_one_key(1, 2).await;
}

/// A 201 replayed after three attempts at least, `waited` or more after
/// the first.
fn assert_replayed_after(status: StatusCode, r: &Report, waited: Duration) {
    assert_eq!(
        (status, r.kind),
        (StatusCode::CREATED, ReportKind::Replayed),
        "{r:?}"
    );
    assert!(r.attempts >= 3, "{r:?}");
    assert!(r.elapsed >= waited, "{r:?}");
}

async fn in_flight_sequence(w: World) {
    let c = client(quick().attempt_timeout(Some(Duration::from_millis(300))));
    let (status, r, _) = send(&c, post(&w.url("/slow"), None)).await;
    // A timeout, a 409 `in_flight` (`Retry-After: 3`), the replay; one more
    // attempt if a 409 itself took longer than the timeout on a loaded machine.
    assert_replayed_after(status, &r, Duration::from_millis(3_300));
    w.ran_with_one_key(1, r.attempts as usize).await;
}

async fn concurrent_sends_one_intent(w: World) {
    let intent = Intent::random();
    let url = w.url("/slow");
    let (c1, c2) = (client(quick()), client(quick()));
    let (a, b) = tokio::join!(
        send(&c1, post(&url, Some(&intent))),
        send(&c2, post(&url, Some(&intent))),
    );
    let mut kinds = [a.1.kind, b.1.kind];
    kinds.sort_by_key(|k| k.as_str());
    assert_eq!(kinds, [ReportKind::Fresh, ReportKind::Replayed]);
    assert_eq!((a.0, b.0), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(a.2, b.2);
    assert_eq!(
        w.ran_with_one_key(1, 3).await,
        format!("\"{}\"", intent.key())
    );
}
